"""What every paper-result pipeline shares: scales, running `zoo` steps, and the markdown report."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path

from dws.tasks.options import TrainOptions
from dws.tasks.rundir import finished_run
from dws.tasks.run import train_run
from zoo.generate.kinds import InrKind, get_kind
from zoo.generate.raylog import quiet_token_notice
from zoo.generate.run import GenerateOptions, generate
from zoo.sources import DataError

REPO_ROOT = Path(__file__).resolve().parents[1]
# the normalization every recorded number was trained with (zoo train's default is orbit for the
# models that claim a symmetry; the pipelines keep entry so their tables stay reproducible)
RECORDED_NORMALIZATION = "entry"


@dataclass(frozen=True)
class Scale:
    name: str
    generate: dict  # GenerateOptions overrides
    train: dict  # TrainOptions overrides


SCALE_HELP = {
    "smoke": "seconds, for the tests",
    "ci": "minutes on a 2-core CPU with offline real data",
    "reduced": "the full protocol on a subset of the data, for hours on a 2-core CPU",
    "xl": "a paper-sized zoo from offline real data, for one GPU without internet",
    "full": "the paper's protocol and data (GPU; --data-root, else ../shared/data)",
}


def parse_args(description: str, default_out: str, scales: dict[str, Scale],
               datasets: dict[str, str] | None = None) -> argparse.Namespace:
    """The options every pipeline takes; the help lists the pipeline's scales and every default.
    ``datasets`` (name: title), for a pipeline whose table has a column per data set: ``--dataset``.

    ``--seeds`` / ``--epochs`` / ``--lr`` replace the chosen scale's training settings in ``scales``
    (the pipeline's own ``SCALES``, which its ``run`` reads and its report prints).
    """
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", choices=tuple(scales), default="ci",
                   help="; ".join(f"{s}: {SCALE_HELP[s]}" for s in scales) + " (default: ci)")
    p.add_argument("--out", default=default_out,
                   help=f"folder for stores, runs and the report (default: {default_out})")
    p.add_argument("--data-root", default=None, help="data folder (official files; default: the "
                                                             "scale's copy in ../shared/data where it has one)")
    p.add_argument("--workers", type=int, default=2, help="zoo generate workers (Ray) (default: 2)")
    p.add_argument("--models", default=None, help="comma-separated subset of the models to train (default: the "
                                                  "scale's)")
    p.add_argument("--seeds", type=int, default=None, help="override the scale's seeds (the report records it)")
    p.add_argument("--epochs", type=int, default=None, help="override the scale's epochs (the report records it)")
    p.add_argument("--lr", type=float, default=None, help="a fixed learning rate instead of the scale's (full: "
                                                          "the search on val; the report records it)")
    if datasets:
        first = next(iter(datasets))
        p.add_argument("--dataset", choices=tuple(datasets), default=first,
                       help="the table's column: " + ", ".join(f"{k}: {v}" for k, v in datasets.items())
                            + f" (default: {first})")
    args = p.parse_args()
    for name in ("seeds", "epochs", "lr"):
        value = getattr(args, name)
        if value is not None and not value > 0:  # (NaN included) refused before any store is made
            p.error(f"--{name} must be positive, got {value}")
    scales[args.scale] = with_overrides(scales[args.scale], args)
    return args


def with_overrides(scale: Scale, args: argparse.Namespace) -> Scale:
    """``scale`` with the training settings given on the command line (what a CPU affords of a GPU-sized
    protocol: e.g. ``--scale full --seeds 1 --lr 1e-3``)."""
    given = {name: getattr(args, name) for name in ("seeds", "epochs", "lr") if getattr(args, name) is not None}
    return replace(scale, train={**scale.train, **given}) if given else scale


def main_with(run, description: str, default_out: str, scales) -> None:
    """The command line of a pipeline whose ``run(scale, out, workers, models, data_root)`` writes a report."""
    args = parse_args(description, default_out, scales)
    models = args.models.split(",") if args.models else None
    print(run(args.scale, Path(args.out) / args.scale, args.workers, models, args.data_root).read_text())


def shared_data(data_root: str | None, name: str | None) -> str | None:
    """``data_root`` if given, else ``../shared/data/NAME`` beside the checkout (the offline copies);
    ``name`` None (a scale without a shared copy): ``data_root`` as it is."""
    if data_root or name is None:
        return data_root
    folder = REPO_ROOT.parent / "shared/data" / name
    if not folder.is_dir():
        raise DataError(f"the {name} files are not in {folder}; pass --data-root with them")
    return str(folder)


def make_store(out: Path, name: str, log=print, **options) -> Path:
    """Generate (or resume, or reuse) a store under ``out/stores``."""
    path = out / "stores" / name
    # The published code's INR: zero biases and a narrow first layer, so fitting writes the signal
    # into W1/b1 instead of leaving them initialization noise (docs/train.md: ci MNIST DWSNet 67% vs
    # 53% with SIREN's wide first layer, 22% with random biases too).
    if isinstance(get_kind(options["kind"]), InrKind):  # (classifier kinds have no --init)
        options.setdefault("init", "reference")
    quiet_token_notice()  # the embedded Ray cluster's (--workers N)
    generate(GenerateOptions(out=str(path), **options), log=log)
    return path


def train(store: Path, out: Path, model: str, task: str, log=print, **options) -> dict:
    """Train one model of a table, or reuse its finished run with the same settings (a pipeline run
    again, e.g. in the next session of a multi-session full-scale run, goes on where it stopped:
    finished models are reused, an unfinished one resumes from its checkpoint).

    Every model normalizes per entry (``normalize="entry"``) unless ``options`` say otherwise: the
    paper's numbers, and the ones recorded in ``docs/`` and the reports, were made so; adapt's
    models take raw networks."""
    run_dir = out / "runs" / f"{store.name}-{model}-{task}"
    if task != "adapt":
        options = {"normalize": RECORDED_NORMALIZATION, **options}
    opts = TrainOptions(store=str(store), model=model, task=task, out=str(run_dir), **options)
    done = finished_run(opts)
    if done is not None:
        log(f"{model}: reusing the finished run in {run_dir} (same store and settings)")
        return done
    return train_run(opts, log=log)


def fmt(metrics: dict, metric: str, scale: float = 1.0, digits: int = 2) -> str:
    """A report cell from :func:`train`'s metrics (see :func:`mean_std`)."""
    return mean_std(metrics["summary"][metric], len(metrics["seeds"]), scale, digits)


def mean_std(summary: dict, seeds: int, scale: float = 1.0, digits: int = 2) -> str:
    """A report cell: ``mean ± std`` over the seeds, the mean alone for one seed (a std over one seed
    is no spread)."""
    if seeds == 1:
        return f"{summary['mean'] * scale:.{digits}f}"
    return f"{summary['mean'] * scale:.{digits}f} ± {summary['std'] * scale:.{digits}f}"


def write_report(path: Path, title: str, header: list[str], rows: list[list[str]], notes: list[str],
                 after: list[str] = ()) -> Path:
    """A markdown report: the title, the table, its notes, then ``after`` (more markdown lines)."""
    lines = [f"# {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += [""] + [f"- {n}" for n in notes] + [""] + list(after)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


def variant_table(store: Path, out: Path, title: str, scale_name: str, train_options: dict,
                  variants: dict[str, dict], paper: dict[str, str], log=print) -> Path:
    """Train DWSNet once per variant (keyword overrides) and tabulate test accuracy beside the paper."""
    rows = []
    for name, overrides in variants.items():
        run_out = out / name.replace(" ", "").replace("+", "_")
        metrics = train(store, run_out, "dwsnet", "classify", log=log, progress=scale_name != "smoke",
                        **{**train_options, **overrides})
        rows.append([name, paper[name], fmt(metrics, "accuracy", 100), f"{metrics['params']:,}"])
    return write_report(out / "report.md", f"{title}, scale {scale_name}",
                        ["variant", "paper (test acc. %)", "ours (test acc. %)", "# params"], rows,
                        [f"store: {store}", f"training: {train_options}"])
