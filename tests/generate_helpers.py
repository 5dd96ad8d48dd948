"""Shared helpers for the ``zoo generate`` tests."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def kill_after_chunks(cmd: list[str], out: Path | str, chunks: int = 2, poll: float = 0.02) -> dict:
    """Run ``cmd`` (a ``zoo generate`` writing ``out``, a folder or a URL), SIGKILL it once its
    manifest lists ``chunks`` finished chunks, and return the manifest it left."""
    from zoo.store.location import store_root

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    manifest = store_root(out) / "manifest.json"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            done = json.loads(manifest.read_text())["complete_chunks"]
        except (FileNotFoundError, json.JSONDecodeError):
            done = []
        if len(done) >= chunks:
            break
        time.sleep(poll)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return json.loads(manifest.read_text())


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
    """Rewrite a store's ``networks.parquet`` as the writer writes it: its checksum recorded in the manifest
    (a test's edited table, e.g. rows marked diverged or holes in a target, read back as a sound store)."""
    from zoo.store.manifest import read_manifest, write_manifest
    from zoo.store.writer import write_table

    manifest = read_manifest(root)
    manifest["checksums"]["files"]["networks.parquet"] = write_table(table, Path(root) / "networks.parquet")
    write_manifest(root, manifest)
