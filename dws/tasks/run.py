"""``zoo train``: check the options, train in this process or on Ray Train workers, write the run directory.

The package's layers, lowest first: :mod:`.options` (choices, defaults, checks without a store),
:mod:`.objectives` (tasks) and :mod:`.models` (models and their hooks), :mod:`.trainer` (the
loop), :mod:`.prepare` (the store checked against task and options, loaders), :mod:`.protocol`
(lr search and seeds), :mod:`.rundir` (writing, reading, plotting, ``zoo eval``),
:mod:`.distributed` (Ray Train) and this module, which launches one or the other.
"""

from __future__ import annotations

from zoo.options import require_writable_folder

from .distributed import train_distributed
from .options import TrainOptions, check_options, default_run_dir, store_defaults
from .prepare import prepare_run
from .protocol import fit_run
from .rundir import write_run


def train_run(opts: TrainOptions, log=print) -> dict:
    """Train as ``opts`` say; the metrics written to the run directory (and its path, ``run_dir``).
    What ``opts`` leave unset follows the store (:func:`.options.store_defaults`, said in one line);
    a run directory that cannot be written is refused before any work."""
    check_options(opts)
    opts, chosen = store_defaults(opts)
    require_writable_folder("--out", opts.out or default_run_dir(opts))
    if chosen:
        log(chosen)
    if opts.workers > 1:
        return train_distributed(opts, log)
    run = prepare_run(opts, log)
    return write_run(run, fit_run(run, log), log)
