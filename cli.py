"""The ``zoo`` command: generate weight stores, inspect them, train and evaluate models on them."""

from __future__ import annotations

import sys
from pathlib import Path

import click


class _ExpectedErrors(click.Group):
    """Show data/store/argument errors as one clear line instead of a traceback."""

    def invoke(self, ctx):
        from dws.weightspace import WeightSpace  # noqa: F401  (fail early if the install is broken)
        from zoo.sources import DataError
        from zoo.store import StoreError

        try:
            return super().invoke(ctx)
        except (DataError, StoreError, KeyError, ValueError) as exc:
            msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            click.secho(f"error: {msg}", fg="red", err=True)
            sys.exit(2)


@click.group(cls=_ExpectedErrors)
def main():
    """Model zoos of small networks (Zarr v3 weight stores) and DWSNets over their weights."""


@main.command()
@click.argument("kind")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Store directory to create or resume.")
@click.option("--dataset", default=None, help="Data source (default: the kind's). E.g. mnist, mnist-offline, digits.")
@click.option("--data-root", default=None, type=click.Path(), help="Folder with the data set's files.")
@click.option("--download", is_flag=True, help="Fetch missing data files from the official mirrors (checksummed).")
@click.option("--limit", type=int, default=None, help="Use at most this many source items, split proportionally.")
@click.option("--views", type=int, default=1, show_default=True, help="Independently initialized INRs per item.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--chunk-size", type=int, default=1024, show_default=True, help="Networks per store chunk (unit of work).")
@click.option("--workers", type=int, default=1, show_default=True, help="Parallel workers (Ray tasks).")
@click.option("--address", default=None, help="Join this Ray cluster instead of starting a local one.")
@click.option("--ray/--no-ray", "use_ray", default=None, help="Force Ray on/off (default: on when --workers > 1).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda.")
@click.option("--init", type=click.Choice(["siren", "reference"]), default="siren", show_default=True,
              help="Standard SIREN init, or the published DWSNets recipe's variant.")
@click.option("--steps", type=int, default=None, help="Override the kind's number of fitting steps.")
@click.option("--lr", type=float, default=None, help="Override the kind's learning rate.")
@click.option("--no-early-stop", is_flag=True, help="Disable the PSNR early stop.")
def generate(kind, out, **kw):
    """Fit a zoo of KIND (mnist-inr, fmnist-inr, cifar10-inr, sine-regression, sine-ssl) into a store."""
    from zoo.generate.run import GenerateOptions, generate as run_generate
    from zoo.inspect import summary
    from zoo.store import WeightStore

    run_generate(GenerateOptions(kind=kind, out=out, **kw), log=click.echo)
    click.echo(summary(WeightStore(out)))


@main.command()
@click.argument("store", type=click.Path(exists=True, file_okay=False))
def info(store):
    """Architecture, counts per split, PSNR percentiles and size on disk of a store."""
    from zoo.inspect import summary
    from zoo.store import WeightStore

    click.echo(summary(WeightStore(store)))


@main.command()
@click.argument("store", type=click.Path(exists=True, file_okay=False))
@click.option("--out", default="grid.png", show_default=True, type=click.Path(dir_okay=False))
@click.option("--count", default=8, show_default=True, help="Networks to draw.")
@click.option("--data-root", default=None, type=click.Path(), help="Where the source images are (to draw them too).")
def show(store, out, count, data_root):
    """Draw decoded INRs beside their source images."""
    from zoo.inspect import show as draw
    from zoo.store import WeightStore

    click.echo(f"wrote {draw(WeightStore(store), Path(out), count, data_root)}")


if __name__ == "__main__":
    main()
