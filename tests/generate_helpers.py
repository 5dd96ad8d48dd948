"""Shared helpers for the ``zoo generate`` tests."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


#: runs ``python -m cli ARGS`` in a process that SIGKILLs itself right after the manifest records
#: its N-th finished chunk (argv: N, then the cli's arguments)
_DIE_AFTER_CHUNKS = """
import os, runpy, signal, sys
import zoo.generate.run as run
limit, record = int(sys.argv.pop(1)), run.mark_chunks_complete
def record_then_die(*args, **kwargs):
    manifest = record(*args, **kwargs)
    if len(manifest["complete_chunks"]) >= limit:
        os.kill(os.getpid(), signal.SIGKILL)
    return manifest
run.mark_chunks_complete = record_then_die
runpy.run_module("cli", run_name="__main__")
"""


class WriteFailed(Exception):
    """A planted failure of a store write."""


def fail_writing(monkeypatch, chunk: int) -> tuple[WriteFailed, list[int]]:
    """Make ``zoo generate``'s write of ``chunk`` raise; the others write as usual. Returns the
    planted exception and the list of chunks whose write was attempted, in order."""
    import zoo.generate.run as run

    failure, real, attempted = WriteFailed("disk full"), run.write_chunk, []

    def write_chunk(root, index, *args, **kwargs):
        attempted.append(index)
        if index == chunk:
            raise failure
        return real(root, index, *args, **kwargs)

    monkeypatch.setattr(run, "write_chunk", write_chunk)
    return failure, attempted


def kill_after_chunks(cmd: list[str], out: Path | str, chunks: int = 2, timeout: float = 300) -> dict:
    """Run ``cmd`` (``[python, -m, cli, generate, ...]`` writing ``out``, a folder or a URL) so that
    it is SIGKILLed once its manifest lists ``chunks`` finished chunks, and return the manifest it
    left. The process kills itself right after recording that chunk, so the count is exact however
    loaded the machine is (an outside poller can miss the moment and find the run finished)."""
    from zoo.store.location import store_root

    assert cmd[1:3] == ["-m", "cli"], cmd
    proc = subprocess.run([cmd[0], "-c", _DIE_AFTER_CHUNKS, str(chunks), *cmd[3:]], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, cwd=REPO, timeout=timeout)
    assert proc.returncode == -signal.SIGKILL, f"the run ended with {proc.returncode} before its chunk {chunks}"
    return json.loads((store_root(out) / "manifest.json").read_text())


#: the settings of conftest's ``tiny_store`` (60 INRs of sklearn's digits in 4 chunks)
TINY = dict(kind="mnist-inr", dataset="digits", limit=60, chunk_size=16, steps=60, lr=1e-3, progress=False)
#: manifest keys that differ between two runs making the same store
VOLATILE = ("created", "completed", "checksum", "command")


def assert_identical_stores(a, b) -> None:
    """The same networks bit for bit, rows, statistics and file checksums (a, b: folders or URLs)."""
    import numpy as np

    from zoo.store import WeightStore

    sa, sb = WeightStore(a), WeightStore(b)
    strip = lambda m: {k: v for k, v in m.items() if k not in VOLATILE}  # noqa: E731
    assert strip(sa.manifest) == strip(sb.manifest)  # includes the checksums of every Parquet and zarr.json file
    for name, values in sa.read(0, sa.num_networks).items():
        np.testing.assert_array_equal(sb.read(0, sb.num_networks)[name], values)
    assert sa.networks.to_pandas().equals(sb.networks.to_pandas())  # (pandas: NaN equals NaN)
    stats_b = sb.stats()
    for name, (mean, std) in sa.stats().items():
        np.testing.assert_array_equal(stats_b[name][0], mean)
        np.testing.assert_array_equal(stats_b[name][1], std)


def replace_networks_table(root: Path, table) -> None:
    """Rewrite a store's ``networks.parquet`` as the writer writes it: its checksum and the content ID recorded in the
    manifest (a test's edited table, e.g. rows marked diverged or holes in a target, read back as a sound store)."""
    from zoo.store.identity import KEY, content_id
    from zoo.store.manifest import read_manifest, write_manifest
    from zoo.store.writer import write_table

    manifest = read_manifest(root)
    manifest["checksums"]["files"]["networks.parquet"] = write_table(table, Path(root) / "networks.parquet")
    if KEY in manifest:  # the content ID follows the table, as the writer's finalize records it
        manifest[KEY] = content_id(root, manifest)
    write_manifest(root, manifest)
