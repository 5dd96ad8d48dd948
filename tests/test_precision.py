"""`zoo train --precision bf16`: the training step under bfloat16 autocast, for every model; parameters,
gradients, optimizer and evaluation stay float32; the precision is part of a run's identity (resume and
the pipelines' reuse compare it), and runs saved before the option existed count as fp32."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner

from dws.tasks.checkpoint import CHECKPOINTS, CheckpointError
from dws.tasks.models import build_model
from dws.tasks.options import MODELS, PRECISIONS, TrainOptions, check_options
from dws.tasks.run import train_run
from dws.tasks.trainer import AUTOCAST_DTYPES, TrainConfig, step_precision
from dws.weightspace import WeightSpace
from test_resume import interrupted  # a kill right after a checkpoint write

QUIET = dict(log=lambda *_: None)
ARGS = dict(model="mlp", task="classify", epochs=2, lr=1e-3, seeds=1, batch_size=8, hidden_channels=8,
            num_layers=1, progress=False)
WIDTHS = (2, 6, 5, 1)


def test_the_cli_choices_are_the_dtypes_the_trainer_knows():
    assert set(PRECISIONS) == set(AUTOCAST_DTYPES) and AUTOCAST_DTYPES["fp32"] is None
    assert AUTOCAST_DTYPES["bf16"] is torch.bfloat16


def test_an_unknown_precision_is_refused_in_one_line(tiny_store):
    with pytest.raises(ValueError, match="--precision 'fp16' is not one of fp32, bf16"):
        check_options(TrainOptions(store=str(tiny_store), precision="fp16"))
    with pytest.raises(ValueError, match="--precision 'fp16' is not one of fp32, bf16"):
        step_precision(TrainConfig(precision="fp16"))


@pytest.mark.parametrize("name", [m for m in MODELS])
def test_every_model_takes_a_bf16_step_with_float32_parameters_and_gradients(name):
    """Forward and loss under autocast, backward and AdamW outside it, as the trainer runs them: the loss
    is finite and near the float32 step's (same weights, same batch), every gradient is float32 and
    finite, some are nonzero, and the parameters stay float32 after the update."""
    torch.manual_seed(0)
    model, _ = build_model(name, WIDTHS, 3, hidden_channels=8, num_layers=2, activation="sine", weight_std=0.05)
    model.train()
    n = sum(a * b for a, b in zip(WIDTHS[:-1], WIDTHS[1:])) + sum(WIDTHS[1:])
    ws = WeightSpace.unflatten(torch.randn(6, n, generator=torch.Generator().manual_seed(1)), WIDTHS)
    target = torch.tensor([0, 1, 2, 0, 1, 2])
    if name == "mlp-align":
        model.align_in_forward = False
    losses = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(2)  # the same dropout draws
        with step_precision(TrainConfig(precision=precision)):
            losses[precision] = torch.nn.functional.cross_entropy(model(ws), target)
    assert losses["bf16"].dtype == torch.float32 and torch.isfinite(losses["bf16"])
    assert abs(losses["bf16"].item() - losses["fp32"].item()) <= 0.05 * abs(losses["fp32"].item()) + 1e-2
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses["bf16"].backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    opt.step()
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_autocast_reaches_the_models_products():
    """Under the bf16 context a model's linear maps compute in bfloat16 (the option is not a no-op);
    under fp32 they do not."""
    model, _ = build_model("mlp", WIDTHS, 3, hidden_channels=4, num_layers=2)
    seen = []
    linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    linear.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    model.eval()
    ws = WeightSpace.unflatten(torch.randn(4, sum(a * b for a, b in zip(WIDTHS[:-1], WIDTHS[1:])) + sum(WIDTHS[1:])),
                               WIDTHS)
    for precision in ("fp32", "bf16"):
        with step_precision(TrainConfig(precision=precision)):
            model(ws)
    assert seen == [torch.float32, torch.bfloat16]


def test_a_bf16_run_trains_another_function_records_its_precision_and_evaluates_as_saved(tiny_store, tmp_path):
    """Through the CLI: the run's config says bf16, its training differs from the fp32 run's (same seed),
    repeats itself exactly, and zoo eval (float32) gives the test metrics the run recorded."""
    from cli import main

    def run(name: str, precision: str) -> dict:
        out = tmp_path / name
        result = CliRunner().invoke(main, ["train", str(tiny_store), "--model", "mlp", "--epochs", "2", "--lr", "1e-3",
                                           "--batch-size", "8", "--hidden-channels", "8", "--num-layers", "1",
                                           "--precision", precision, "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert json.loads((out / "config.json").read_text())["options"]["precision"] == precision
        return json.loads((out / "metrics.json").read_text())

    fp32, bf16, again = run("fp32", "fp32"), run("bf16", "bf16"), run("bf16-again", "bf16")
    assert fp32["history"] != bf16["history"]
    assert again["history"] == bf16["history"] and again["test"] == bf16["test"]
    result = CliRunner().invoke(main, ["eval", str(tmp_path / "bf16"), str(tiny_store)])
    assert result.exit_code == 0, result.output
    evaluated = json.loads(result.output[result.output.index("{"):])
    recorded = bf16["test"][0] if isinstance(bf16["test"], list) else bf16["test"]
    assert evaluated["accuracy"] == pytest.approx(recorded["accuracy"], abs=0)


def test_an_unfinished_bf16_run_resumes_in_bf16_only(tiny_store, tmp_path, monkeypatch):
    opts = TrainOptions(store=str(tiny_store), out=str(tmp_path / "run"), precision="bf16", **ARGS)
    interrupted(opts, monkeypatch, 1)
    with pytest.raises(CheckpointError, match="--precision: unfinished run 'bf16', now 'fp32'"):
        train_run(replace(opts, precision="fp32"), **QUIET)
    assert (tmp_path / "run" / CHECKPOINTS).is_dir()  # refused, nothing lost
    lines = []
    train_run(opts, log=lines.append)
    assert any("resuming" in line and "after epoch 1 of 2" in line for line in lines), lines


def test_a_finished_run_saved_before_the_option_is_reused_as_fp32_only(tiny_store, tmp_path):
    from dws.tasks.rundir import finished_run

    opts = TrainOptions(store=str(tiny_store), out=str(tmp_path / "run"), **ARGS)
    train_run(opts, **QUIET)
    config_file = tmp_path / "run" / "config.json"
    config = json.loads(config_file.read_text())
    del config["options"]["precision"]
    config_file.write_text(json.dumps(config))
    assert finished_run(opts) is not None
    assert finished_run(replace(opts, precision="bf16")) is None


@pytest.mark.parametrize("backend", ["auto", "pytorch"])
def test_an_accelerated_dwsnet_under_autocast_is_its_plain_modules_under_autocast(backend):
    """The accelerator's fused forms are float32 code: under autocast each steps aside for its plain
    module, so the accelerated DWSNet computes exactly what the plain one does in bfloat16 (outputs and
    gradients), and differs from its own float32 step (autocast reached it)."""
    from dws.nn.fast import accelerate, suspended

    torch.manual_seed(0)
    model, _ = build_model("dwsnet", WIDTHS, 3, hidden_channels=8, num_layers=2)
    accelerate(model, backend)
    model.train()
    n = sum(a * b for a, b in zip(WIDTHS[:-1], WIDTHS[1:])) + sum(WIDTHS[1:])
    ws = WeightSpace.unflatten(torch.randn(6, n, generator=torch.Generator().manual_seed(1)), WIDTHS)

    def step(precision: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        with step_precision(TrainConfig(precision=precision)):
            out = model(ws)
        out.float().square().sum().backward()
        return out.detach().float(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    fast_out, fast_grads = step("bf16")
    with suspended(model):
        plain_out, plain_grads = step("bf16")
    assert torch.equal(fast_out, plain_out)
    assert len(fast_grads) == len(plain_grads) and all(torch.equal(a, b) for a, b in zip(fast_grads, plain_grads))
    assert not torch.equal(step("fp32")[0], fast_out)


def test_the_benchmark_times_each_models_bf16_step_beside_its_float32_one(monkeypatch, capsys):
    """``benchmarks/weight_models.py --bf16``: the worker alternates float32 steps with steps under the
    trainer's own autocast context (seen here: each bf16 step enters it), and the table gives the
    speedup and the ratio to the DWSNet's float32 step."""
    import argparse

    from benchmark_helpers import load_benchmark

    bench = load_benchmark()
    entered = []
    real = bench.step_precision
    monkeypatch.setattr(bench, "step_precision", lambda config: entered.append(config.precision) or real(config))
    args = argparse.Namespace(model="nfn-hnp", widths=[2, 5, 1], hidden_channels=8, input_reduction=0,
                              activation="sine", batch=4, iters=2, threads=1, device="cpu", compile=False, bf16=True)
    row = bench.measure(args)
    assert entered == ["fp32", "bf16"] * 4 and row["step_s"] > 0 and row["bf16_s"] > 0
    base = {"model": "dwsnet", "step_s": 2.0, "bf16_s": 4.0}
    bench.print_bf16([base, {**row, "step_s": 1.0, "bf16_s": 0.5}], base)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2].split()[1:] == ["2.000", "4.000", "0.50", "2.00"]
    assert lines[-1].split()[1:] == ["1.000", "0.500", "2.00", "0.25"]


def test_the_benchmark_compiles_the_bf16_step_with_both_flags(monkeypatch, capsys):
    """``--compile --bf16``: the compiled step runs under the bf16 autocast too (``zoo train --compile
    --precision bf16``), alternated with the eager bf16 step it is compared with, and the compiled table's
    eager column is that bf16 step, over the DWSNet's float32 one (torch.compile stubbed: seconds)."""
    import argparse

    from benchmark_helpers import load_benchmark

    bench = load_benchmark()
    entered, wrapped = [], []
    real = bench.step_precision
    monkeypatch.setattr(bench, "step_precision", lambda config: entered.append(config.precision) or real(config))
    monkeypatch.setattr(torch, "compile", lambda model, *a, **k: wrapped.append(model) or model)
    args = argparse.Namespace(model="nfn-hnp", widths=[2, 5, 1], hidden_channels=8, input_reduction=0,
                              activation="sine", batch=4, iters=2, threads=1, device="cpu", compile=True, bf16=True)
    row = bench.measure(args)
    assert len(wrapped) == 1
    assert entered == ["fp32", "bf16"] * 4 + ["bf16"] + ["bf16", "bf16"] * 4  # the compiling step, then the pairs
    assert row["eager_alternated_s"] > 0 and row["compiled_s"] > 0 and row["compile_s"] > 0
    base = {"model": "dwsnet", "step_s": 2.0, "bf16_s": 1.5, "eager_alternated_s": 1.0, "compiled_s": 0.5,
            "compile_s": 9.0}
    bench.print_compiled([base, {**row, "step_s": 4.0, "eager_alternated_s": 3.0, "compiled_s": 1.5}], base)
    out = capsys.readouterr().out.splitlines()
    assert out[-4].split()[1:] == ["1.000", "0.500", "2.00", "9", "0.5", "0.2", "1.0"]
    assert out[-3].split()[1:4] == ["3.000", "1.500", "2.00"] and out[-3].split()[5:] == ["1.5", "0.8", "3.0"]
    assert out[-1].startswith("with --bf16: eager and compiled are bf16 steps")


def test_zoo_train_in_bf16_on_a_cpu_without_native_bfloat16_warns_and_trains(tiny_store, tmp_path, monkeypatch):
    """--precision bf16 where the CPU has no native bfloat16: one warning line that says so before training,
    and the run trains as asked (a resumed bf16 run keeps its precision)."""
    from cli import main
    from zoo import cpuinfo

    fake = tmp_path / "cpuinfo"
    fake.write_text("processor\t: 0\nflags\t\t: avx2 fma\n")
    monkeypatch.setattr(cpuinfo, "CPUINFO", fake)
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["train", str(tiny_store), "--out", str(out), "--epochs", "1", "--lr", "1e-3",
                                       "--batch-size", "8", "--hidden-channels", "2", "--num-layers", "1",
                                       "--precision", "bf16", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    warned = [line for line in result.output.splitlines() if "without native bfloat16" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: --precision bf16 on a CPU without native bfloat16")
    assert (out / "metrics.json").exists()


def test_the_adaptation_task_trains_in_bf16(pair_store, tmp_path):
    """--task adapt (the adapter's output is a weight space, judged by running the adapted classifiers on
    images inside the loss): a bf16 run trains, records its precision, and reports finite accuracies."""
    from cli import main

    out = tmp_path / "adapt"
    result = CliRunner().invoke(main, ["train", str(pair_store), "--task", "adapt", "--out", str(out), "--epochs", "1",
                                       "--lr", "1e-3", "--batch-size", "4", "--hidden-channels", "4",
                                       "--num-layers", "1", "--input-reduction", "4", "--precision", "bf16"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "config.json").read_text())["options"]["precision"] == "bf16"
    test = json.loads((out / "metrics.json").read_text())["test"]
    test = test[0] if isinstance(test, list) else test
    assert all(torch.isfinite(torch.tensor(float(v))) for v in test.values() if isinstance(v, (int, float)))
