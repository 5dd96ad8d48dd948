"""``zoo train``: check the options, train in this process or on Ray Train workers, write the run directory.

The package's layers, lowest first: :mod:`.options` (choices, defaults, checks without a store),
:mod:`.objectives` (tasks) and :mod:`.models` (models and their hooks), :mod:`.trainer` (the
loop), :mod:`.prepare` (the store checked against task and options, loaders), :mod:`.protocol`
(lr search and seeds), :mod:`.rundir` (writing, reading, plotting, ``zoo eval``),
:mod:`.distributed` (Ray Train) and this module, which launches one or the other.
"""

from __future__ import annotations

from .distributed import train_distributed
from .options import TrainOptions, check_options
from .prepare import prepare_run
from .protocol import fit_run
from .rundir import write_run


def train_run(opts: TrainOptions, log=print) -> dict:
    """Train as ``opts`` say; the metrics written to the run directory (and its path, ``run_dir``)."""
    check_options(opts)
    if opts.workers > 1:
        return train_distributed(opts, log)
    run = prepare_run(opts, log)
    return write_run(run, fit_run(run, log), log)
