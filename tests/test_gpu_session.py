"""The GPU session's scripts on a machine without a GPU: every CUDA stage says it skipped and the run
still ends with its summary; the fitting-step benchmark runs end to end in Triton's interpreter."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour")
def test_gpu_session_skips_cuda_stages_cleanly_on_a_cpu(tmp_path):
    results = tmp_path / "results"
    done = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_session.sh")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "RESULTS": str(results), "WORK": str(tmp_path / "work"),
                                            "DISK_TEST_MB": "8", "PYTHON": sys.executable})
    assert done.returncode == 0, done.stdout + done.stderr
    files = sorted(p.name for p in results.iterdir())
    assert files == ["clfgen.txt", "done", "dws.txt", "env.txt", "fit.txt", "gen.txt", "models.txt", "summary.txt"]
    for stage in ("fit", "gen", "clfgen", "dws", "models"):
        text = (results / f"{stage}.txt").read_text()
        assert "skipped: no CUDA" in text and f"=== {stage}: exit 0" in text
    env = (results / "env.txt").read_text()
    assert "MB/s" in env and "torch" in env and "=== env: exit 0" in env


def test_gpu_session_refuses_an_unknown_stage(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_session.sh"), "nonsense"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "RESULTS": str(tmp_path), "WORK": str(tmp_path)})
    assert done.returncode == 2 and "unknown stage nonsense" in done.stdout


@pytest.mark.skipif(torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1",
                    reason="runs the benchmark in Triton's interpreter")
def test_fit_gpu_step_benchmark_runs_and_picks_an_accurate_configuration(tmp_path):
    pytest.importorskip("triton")
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/fit_gpu_step.py"), "--networks", "2", "--steps", "1",
         "--configs", "16,1,ieee", "bad,config", "--single", "1", "--single-steps", "2", "--check", "2"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stderr
    assert "pytorch step + MaskedAdam" in done.stdout and "triton 16,1,ieee" in done.stdout
    assert "triton bad,config: failed" in done.stdout  # a configuration that cannot run is reported, not fatal
    assert "BEST triton=16,1,ieee" in done.stdout and "goal: fitting step >= 50% of fp32 peak" in done.stdout
