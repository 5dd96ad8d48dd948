import os

import pytest
import torch

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory):
    """A small complete INR store of sklearn's 8x8 digits (fast to fit, real images)."""
    from zoo.generate.run import GenerateOptions, generate

    out = tmp_path_factory.mktemp("stores") / "digits"
    generate(GenerateOptions(kind="mnist-inr", out=str(out), dataset="digits", limit=60, chunk_size=16,
                             steps=60, lr=1e-3, progress=False), log=lambda *_: None)
    return out
