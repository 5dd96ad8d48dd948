"""Shared helpers for the ``zoo generate`` tests."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def kill_after_chunks(cmd: list[str], out: Path, chunks: int = 2, poll: float = 0.02) -> dict:
    """Run ``cmd`` (a ``zoo generate`` writing ``out``), SIGKILL it once its manifest lists
    ``chunks`` finished chunks, and return the manifest it left."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    manifest = out / "manifest.json"
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
