"""`zoo train --compile`: the training step goes through torch.compile, evaluation and the saved
state stay the eager module's, and the option is speed-only (a run's identity does not depend on it)."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from dws.tasks.options import TrainOptions
from dws.tasks.prepare import SPEED_ONLY
from dws.tasks.run import train_run

ARGS = dict(model="dwsnet", task="classify", epochs=2, lr=1e-3, seeds=1, batch_size=8, hidden_channels=2,
            num_layers=1, progress=False)


def test_compile_wraps_the_training_step_only(tiny_store, tmp_path, monkeypatch):
    """torch.compile is called once per training, on the model being trained; with an identity in its
    place the run is the eager run exactly (same losses, same test accuracy, same state dict keys)."""
    compiled = []

    def fake_compile(model, *args, **kwargs):
        compiled.append(model)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    runs = {}
    for flag in (False, True):
        out = tmp_path / f"compile-{flag}"
        train_run(TrainOptions(store=str(tiny_store), out=str(out), compile=flag, **ARGS), log=lambda *_: None)
        runs[flag] = json.loads((out / "metrics.json").read_text())
    assert len(compiled) == 1 and isinstance(compiled[0], torch.nn.Module)
    assert runs[True]["history"] == runs[False]["history"]
    assert runs[True]["test"] == runs[False]["test"]
    saved = torch.load(tmp_path / "compile-True" / "best.pt", weights_only=False)
    keys = saved["state_dict"].keys() if "state_dict" in saved else saved.keys()
    assert not any("_orig_mod" in k for k in keys)


def test_compile_is_speed_only_and_on_the_command_line(tiny_store, tmp_path, monkeypatch):
    from cli import main

    assert "compile" in SPEED_ONLY
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, *a, **k: calls.append(model) or model)
    out = tmp_path / "cli"
    result = CliRunner().invoke(main, ["train", str(tiny_store), "--model", "dwsnet", "--epochs", "1", "--lr", "1e-3",
                                       "--batch-size", "8", "--hidden-channels", "2", "--num-layers", "1",
                                       "--compile", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert len(calls) == 1


@pytest.mark.slow
@pytest.mark.parametrize("model, channels", [("ng-gnn", 2), ("dwsnet", 8)])
def test_a_really_compiled_step_trains_like_the_eager_one(tiny_store, tmp_path, model, channels):
    """torch.compile for real (inductor, a C++ compiler) on a neural graph, the model the option is for,
    and on a DWSNet whose eager step takes the native kernels (8 channels): the same losses up to float
    rounding (the compiled DWSNet once failed at its first step: inductor cannot lower those calls)."""
    runs = {}
    for flag in (False, True):
        out = tmp_path / f"real-{flag}"
        opts = TrainOptions(store=str(tiny_store), out=str(out), compile=flag,
                            **{**ARGS, "model": model, "hidden_channels": channels})
        train_run(opts, log=lambda *_: None)
        runs[flag] = json.loads((out / "metrics.json").read_text())
    eager, compiled = ([h["train_loss"] for h in runs[f]["history"][0]] for f in (False, True))
    assert compiled == pytest.approx(eager, rel=1e-4, abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["ng-gnn", "ng-transformer"])
def test_a_really_compiled_bf16_step_of_a_neural_graph_trains_like_the_eager_one(tiny_store, tmp_path, model):
    """--compile --precision bf16, as the table's neural-graph full cells train: the step builds (torch 2.13's
    inductor once refused it: one bf16 reduction stored under one C++ name twice, dws.ng.graph.edge_sum) and
    gives the eager bf16 losses up to bf16 rounding (two full batches: one compile, the costly part)."""
    runs = {}
    for flag in (False, True):
        out = tmp_path / f"bf16-{flag}"
        opts = TrainOptions(store=str(tiny_store), out=str(out), compile=flag, precision="bf16",
                            **{**ARGS, "model": model, "hidden_channels": 2, "epochs": 1, "train_limit": 16})
        train_run(opts, log=lambda *_: None)
        runs[flag] = json.loads((out / "metrics.json").read_text())
    eager, compiled = ([h["train_loss"] for h in runs[f]["history"][0]] for f in (False, True))
    assert len(eager) == 1 and compiled == pytest.approx(eager, rel=1e-2)


def test_compile_without_a_cpp_compiler_is_refused_in_one_line(tiny_store, tmp_path, monkeypatch):
    """No C++ compiler on a CPU: a ValueError naming what is missing before any step, not an inductor
    traceback at the first one; torch.compile is never called."""
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, *a, **k: calls.append(model) or model)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(ValueError, match="needs a C.. compiler"):
        train_run(TrainOptions(store=str(tiny_store), out=str(tmp_path / "run"), compile=True, **ARGS),
                  log=lambda *_: None)
    assert calls == []
    monkeypatch.setenv("CXX", "/no/such/compiler")
    with pytest.raises(ValueError, match="/no/such/compiler"):
        train_run(TrainOptions(store=str(tiny_store), out=str(tmp_path / "run2"), compile=True, **ARGS),
                  log=lambda *_: None)


def test_a_traced_dwsnet_step_keeps_to_public_operators(monkeypatch):
    """Under torch.compile the DWSNet's fast paths step aside (the native kernels and the private oneDNN
    op, which inductor cannot lower): the same tensors take them eagerly."""
    from dws.nn.fast import matmul, native

    x, w = torch.randn(64, 32, 32, 8), torch.randn(8, 8)
    eager = (native.usable(x, w, channels=(8, 8)), matmul.uses_onednn(x, w, min_rows=0))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert native.usable(x, w, channels=(8, 8)) is False and matmul.uses_onednn(x, w, min_rows=0) is False
    assert eager == (native.library() is not None, matmul._LINEAR is not None)


class FailsToCompile(torch.nn.Module):
    """What torch.compile returns when inductor cannot build the step: it raises at the first call
    (``where="forward"``) or once the backward graph is built (``"backward"``)."""

    def __init__(self, model, where):
        super().__init__()
        self.model, self.where = model, where

    def forward(self, *args, **kwargs):
        from torch._inductor.exc import InductorError

        error = InductorError(RuntimeError("C++ compile error\nconflicting declaration 'auto tmp_acc0_vec'"), None)
        if self.where == "forward":
            raise error
        return _fail_backward(self.model(*args, **kwargs), error)


def _fail_backward(out, error):
    """``out`` unchanged, whose backward raises ``error`` (as a lazily compiled backward graph does)."""
    class Fail(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            raise error

    return Fail.apply(out)


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_step_torch_compile_cannot_build_is_one_line_and_loses_nothing(tiny_store, tmp_path, monkeypatch, where):
    """inductor failing to build the step (a C++ compile error in torch's own code generation, seen with
    --compile --precision bf16 on the neural graphs, torch 2.13): one error line that says to drop
    --compile; the same command without it then trains the run."""
    from cli import main

    monkeypatch.setattr(torch, "compile", lambda model, *a, **k: FailsToCompile(model, where))
    out = tmp_path / "run"
    args = ["train", str(tiny_store), "--model", "dwsnet", "--epochs", "1", "--lr", "1e-3", "--batch-size", "8",
            "--hidden-channels", "2", "--num-layers", "1", "--precision", "bf16", "--out", str(out)]
    failed = CliRunner().invoke(main, args + ["--compile"])
    last = failed.output.strip().splitlines()[-1]
    assert failed.exit_code != 0 and last.startswith("error: --compile: torch.compile could not build"), failed.output
    assert "with --precision bf16" in last and "InductorError" in last and "without --compile" in last
    assert "Traceback" not in failed.output
    trained = CliRunner().invoke(main, args)
    assert trained.exit_code == 0, trained.output
    assert (out / "metrics.json").exists()


def test_other_errors_of_a_compiled_step_are_not_rewritten(tiny_store, tmp_path, monkeypatch):
    class Broken(torch.nn.Module):
        def forward(self, *args, **kwargs):
            raise RuntimeError("a bug in the model")

    monkeypatch.setattr(torch, "compile", lambda model, *a, **k: Broken())
    with pytest.raises(RuntimeError, match="a bug in the model"):
        train_run(TrainOptions(store=str(tiny_store), out=str(tmp_path / "run"), compile=True, **ARGS),
                  log=lambda *_: None)
