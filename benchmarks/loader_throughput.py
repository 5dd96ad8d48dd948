"""Store loader throughput vs DWSNet training throughput, measured in one run.

    python benchmarks/loader_throughput.py [--networks 4096] [--chunk-size 256] [--batch-size 512]

Writes a synthetic store of random MNIST-INR-shaped networks (2 -> 32 -> 32 -> 1, the store's own
writer, so the same Zarr/Parquet layout as a generated store; files are in the page cache), then
times full epochs of the train split for each loader mode (best of ``--epochs``), and a DWSNet
(``dwsnet_mnist_inr_config``: 4 DWS layers, 48 channels) forward + backward + Adam step at the same
batch size. If ``dws.DWSNetInvariant`` cannot be imported, the training side is a 3-layer MLP on
the flattened weights instead, and the table says so. Goal: loader >= 5x training samples/s.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's zoo and dws, not another install

from dws.stream import WeightStoreLoader, inr_augmentation  # noqa: E402
from dws.stream.synthetic import write_synthetic_store  # noqa: E402

WIDTHS = (2, 32, 32, 1)


def loader_rate(loader: WeightStoreLoader, epochs: int) -> float:
    """Networks per second over one epoch, best of ``epochs`` (each batch touched, like training)."""
    best = 0.0
    for _ in range(epochs):
        t0, seen = time.perf_counter(), 0
        for batch in loader:
            seen += len(batch)
            batch.ws.weights[0].sum()
        best = max(best, seen / (time.perf_counter() - t0))
    return best


def training_model():
    """The paper's MNIST-INR DWSNet, or (when not importable) a documented MLP stand-in."""
    try:
        from dws import DWSNetInvariant, dwsnet_mnist_inr_config

        return DWSNetInvariant(**dwsnet_mnist_inr_config(10)), "DWSNetInvariant (dwsnet_mnist_inr_config)"
    except ImportError as exc:
        size = sum(i * o + o for i, o in zip(WIDTHS[:-1], WIDTHS[1:]))
        mlp = torch.nn.Sequential(torch.nn.Linear(size, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                  torch.nn.ReLU(), torch.nn.Linear(512, 10))
        return _Flat(mlp), f"MLP {size}-512-512-10 on flattened weights (DWSNetInvariant not importable: {exc})"


class _Flat(torch.nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.mlp = mlp

    def forward(self, ws):
        return self.mlp(ws.flatten())


def training_rate(loader: WeightStoreLoader, steps: int) -> tuple[float, str]:
    model, name = training_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = next(iter(loader))

    def step():
        loss = torch.nn.functional.cross_entropy(model(batch.ws), batch.target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    step()  # warm-up
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * len(batch) / (time.perf_counter() - t0), name


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--networks", type=int, default=4096)
    p.add_argument("--chunk-size", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--epochs", type=int, default=3, help="epochs per loader mode (best one reported)")
    p.add_argument("--train-steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (main process)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        root = write_synthetic_store(f"{tmp}/store", widths=WIDTHS, num_networks=args.networks,
                                     chunk_size=args.chunk_size)

        def make(**kw):
            return WeightStoreLoader(root, batch_size=args.batch_size, seed=0, **kw)

        modes = [
            ("in memory", make(in_memory=True)),
            ("streaming, 0 workers", make(in_memory=False, num_workers=0)),
            ("streaming, 2 workers", make(in_memory=False, num_workers=2)),
            ("in memory + INR augmentation", make(in_memory=True, augment=inr_augmentation())),
            ("streaming, 2 workers + INR augmentation", make(in_memory=False, num_workers=2, augment=inr_augmentation())),
        ]
        rows = [(name, loader_rate(loader, args.epochs)) for name, loader in modes]
        train, model_name = training_rate(modes[0][1], args.train_steps)

    n_train = modes[0][1].num_networks
    print(f"store: {args.networks} random {'-'.join(map(str, WIDTHS))} networks ({n_train} train), "
          f"chunks of {args.chunk_size}, batch {args.batch_size}, torch threads {args.threads}, "
          f"{os.cpu_count()} cores")
    print(f"training: {model_name}")
    print(f"{'':42s} {'samples/s':>10s} {'x training':>11s}")
    print(f"{'training (forward + backward + Adam)':42s} {train:10.0f} {1.0:11.1f}")
    for name, rate in rows:
        print(f"{'loader: ' + name:42s} {rate:10.0f} {rate / train:11.1f}")
    slowest = min(rate for _, rate in rows)
    print(f"slowest loader / training = {slowest / train:.1f}x (goal >= 5x): {'met' if slowest >= 5 * train else 'NOT met'}")


if __name__ == "__main__":
    main()
