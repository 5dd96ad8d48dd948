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


@pytest.fixture(scope="session")
def cifar_like(tmp_path_factory):
    """Synthetic CIFAR-10 python batches (tests/clf_helpers.py)."""
    from clf_helpers import write_cifar_like

    return write_cifar_like(tmp_path_factory.mktemp("cifar-like"))


@pytest.fixture(scope="session")
def pair_store(cifar_like, tmp_path_factory):
    """10 binary classifiers of the synthetic CIFAR-10 images (8 / 1 / 1 runs); read, never modified."""
    from zoo.generate.run import GenerateOptions, generate

    out = tmp_path_factory.mktemp("pairs") / "store"
    generate(GenerateOptions(kind="cifar10-classifiers", out=str(out), data_root=str(cifar_like),
                             source_options={"verify": False}, limit=10, batch_size=16, chunk_size=4,
                             progress=False), log=lambda *_: None)
    return out
