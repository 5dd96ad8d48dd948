"""Classifier zoos: MLP classifiers trained as one batched computation (:mod:`zoo.train`).

Layout. Runs are numbered as in the paper-sized zoo, split by run: train runs first, then val,
then test (``cifar10-classifiers``: 4,000 / 500 / 500; trajectory kinds: 150 / 25 / 25).
``--limit N`` keeps the first runs of each split in the splits' proportions, so a small zoo holds
exactly the first runs of the full one. A run stores its checkpoints (only the final network for
kinds without trajectories) one after the other: network index = position in the store,
``trajectory_id`` = the run's number, ``step`` = optimizer steps before the checkpoint. A chunk
holds whole runs (the asked ``--chunk-size`` is rounded down to a multiple of the checkpoints per
run), so a resume retrains exactly the runs of the missing chunks, and every run's networks depend
on ``(seed, run)`` alone: not on the chunking, the workers, or the runs trained beside it.

Jobs. On a GPU one job trains the runs of several consecutive missing chunks as one group (as many
chunks as the trainer's GPU memory budget, :func:`zoo.train.trainer.default_group`, holds), then
splits the checkpoints into one result per chunk; on a CPU a job is one chunk (its trainer groups
hold a few networks, so a chunk already fills them). See :meth:`ClassifierRecipe.chunks_per_job`.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pyarrow as pa
import torch

from ..sources import SPLITS
from ..sources.errors import DataError
from ..store.format import FAMILY_CLASSIFIERS, bias_name, weight_name
from ..train.data import ClassifierData, classifier_data, input_manifest
from ..train.mlp import ACTIVATIONS, MlpSpec, init_bound
from ..train.runs import Diversity, RunSettings, draw_run
from ..train.schedule import TrainSchedule
from ..train.trainer import class_counts, default_group, host_arrays, train_runs
from ..train.evaluate import TIE_MARGIN
from .chunk import ChunkTarget, finish_chunk
from .plan import limited_counts
from .recipe import Layout, Recipe, forced_job_chunks, refuse_options

INR_OPTIONS = {  # options of INR kinds, at their defaults
    "views": 1, "init": "siren", "psnr_stop": None, "no_early_stop": False, "compile": False,
    "fit_backend": "auto"}
RUN_RULE = ("runs are numbered as in the full zoo, split by run (train, val, test in that order); --limit keeps the "
            "first runs of each split; a run's checkpoints are consecutive networks, in step order")


class ClassifierRecipe(Recipe):
    verb = "training"

    def __init__(self, kind, opts):
        refuse_options(opts, INR_OPTIONS, kind.name, "INR kinds")
        self.kind, self.opts = kind, opts
        overrides = {"epochs": opts.epochs, "batch_size": opts.batch_size, "lr": opts.lr,
                     "checkpoint_every": opts.checkpoint_every, "steps": opts.steps}
        self.schedule: TrainSchedule = replace(kind.schedule, **{k: v for k, v in overrides.items() if v is not None})
        self.diversity = Diversity() if opts.diversity else None
        self.spec = MlpSpec(kind.widths)
        self.dataset = kind.check_dataset(opts.dataset)
        self.generation = {
            "kind": kind.name, "dataset": self.dataset, "limit": opts.limit, "seed": opts.seed,
            "chunk_size": opts.chunk_size, "train": self.schedule.to_manifest(),
            "classes_per_run": kind.classes_per_run,
            "diversity": None if self.diversity is None else self.diversity.to_manifest(),
            **({"source_options": opts.source_options} if opts.source_options else {}),
        }

    def settings(self) -> dict:
        return {"generation": self.generation, "architecture": self.architecture()}

    def architecture(self) -> dict:
        """Everything needed to evaluate a stored classifier (the numpy-only test uses nothing else)."""
        kind, diverse = self.kind, self.diversity is not None
        used = self.diversity.activations if diverse else ("relu",)
        return {
            "family": FAMILY_CLASSIFIERS,
            "widths": list(kind.widths),
            "activation": "per network: column activation" if diverse else "relu",
            "activations": {name: ACTIVATIONS[name].formula for name in used},
            "layers": "h_0 = x; h_m = act(W_m @ h_{m-1} + b_m) for m = 1 .. M-1; logits = W_M @ h_{M-1} + b_M",
            "weight_layout": "out x in (PyTorch nn.Linear)",
            "pytorch": "nn.Sequential(nn.Linear(d_0, d_1), act, ..., nn.Linear(d_{M-1}, d_M)) with W_m, b_m as "
                       "the m-th Linear's weight and bias",
            "dropout": ("training only: inverted dropout with the network's rate (column dropout) after every "
                        "hidden activation; none at evaluation") if diverse else "none",
            "init": f"W_m, b_m ~ U(-a, a), a = init_scale / sqrt(d_(m-1)) (nn.Linear's default for init_scale 1; "
                    f"layer 1: {init_bound(kind.widths[0]):.6g}), drawn with torch.Generator().manual_seed(seed) "
                    f"in the order W_1, b_1, W_2, ...",
            "input": input_manifest(kind.image_shape, kind.input_mean, kind.input_std),
            "output": {
                "classes": "column classes: the classes the network learns (all of them, in order, or the pair "
                           "drawn for its run)",
                "loss": "cross-entropy over logits[classes] (target: the position of the label in classes); the "
                        "other logits are ignored and their rows of W_M, b_M keep their initial values",
                "prediction": "classes[argmax_j logits[classes[j]]], the first maximum on ties",
            },
            "evaluation": {
                "images": "the official test split's images whose label is in classes",
                "test_accuracy": "fraction predicted as their label, logits computed in float64 from the float32 "
                                 "weights and inputs (float32 with a float64 recomputation of every image whose two "
                                 f"best logits are within {TIE_MARGIN:g} * (1 + |best|): the same argmax)",
            },
        }

    def plan(self, source) -> Layout:
        kind, schedule = self.kind, self.schedule
        data = classifier_data(source, kind.input_mean, kind.input_std)
        if data.image_shape != kind.image_shape:
            raise DataError(f"{kind.name} trains on {'x'.join(map(str, kind.image_shape))} images; "
                            f"{source.name} has {'x'.join(map(str, data.image_shape))}")
        num_classes = self.spec.num_classes
        for labels in (data.train_labels, data.test_labels):
            if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
                raise DataError(f"{source.name}: labels outside 0..{num_classes - 1}")
        counts = limited_counts(kind.splits, self.opts.limit)
        self.runs: list[RunSettings] = []
        first, splits, start = 0, {}, 0
        for split in SPLITS:
            self.runs += [draw_run(self.opts.seed, r, num_classes, kind.classes_per_run, schedule.lr, self.diversity)
                          for r in range(first, first + counts[split])]
            first += kind.splits[split]
        totals = [schedule.total_steps(n) for n in class_counts(data.train_labels, self.runs)]
        steps = [schedule.checkpoint_steps(t) for t in totals]
        per_run = {len(s) for s in steps}
        if len(per_run) > 1:
            raise ValueError(f"runs of {kind.name} take different numbers of steps (their classes have different "
                             f"numbers of images), so their trajectories differ in length; store trajectories "
                             f"with a fixed --steps")
        self.checkpoints = per_run.pop()
        self.max_steps = max(totals, default=0)
        self.runs_per_chunk = max(1, self.opts.chunk_size // self.checkpoints)
        for split in SPLITS:
            splits[split] = {"start": start, "count": counts[split] * self.checkpoints, "runs": counts[split]}
            start += counts[split] * self.checkpoints
        self.columns = self._columns(steps, splits)
        self.data = data
        provenance = source.provenance()
        provenance.update({
            "images": {"train": len(data.train_labels), "test": len(data.test_labels)},
            "used": "networks train on the official train split (all of it) and are tested on the official test "
                    "split, each on the images of its classes",
        })
        return Layout(
            num_networks=start, splits=splits,
            chunk_size=self.runs_per_chunk * self.checkpoints,
            metadata={
                "kind": kind.name,
                "description": kind.description,
                "architecture": self.architecture(),
                "targets": list(kind.targets),
                "generation": self.generation,
                "source": provenance,
                "runs": {"count": len(self.runs), "checkpoints_per_run": self.checkpoints, "rule": RUN_RULE},
            },
        )

    def _columns(self, steps: list[list[int]], splits: dict) -> dict[str, list]:
        """The per-network columns known before training."""
        split_of = [s for s in SPLITS for _ in range(splits[s]["count"])]
        columns: dict[str, list] = {"index": list(range(len(split_of))), "split": split_of, "trajectory_id": [],
                                    "step": []}
        for run, run_steps in zip(self.runs, steps):
            for step in run_steps:
                columns["trajectory_id"].append(run.run)
                columns["step"].append(step)
                for name, value in run.columns().items():
                    columns.setdefault(name, []).append(value)
        return columns

    def share(self, executor) -> None:
        self.data.key  # hash the images once here rather than in every task
        self.shared_data = executor.share(self.data)

    def chunks_per_job(self, device: str, workers: int) -> int:
        """On a GPU: as many chunks as the runs of one trainer group (:func:`default_group`: half
        the GPU's free memory, shared by the ``workers`` tasks on it; ``group`` where given) fill;
        on a CPU one (a trainer group is a few networks there, and a chunk already holds several
        groups). ``$ZOO_JOB_CHUNKS`` forces a number (tests, benchmarks)."""
        forced = forced_job_chunks()
        if forced is not None:
            return forced
        if not device.startswith("cuda"):
            return 1
        if self.opts.group:
            group = self.opts.group
        else:
            group = default_group(self.schedule, self.data.input_size, device, self.spec, self.max_steps,
                                  self.checkpoints) // max(1, workers)
        return max(1, group // self.runs_per_chunk)

    def job(self, target: ChunkTarget | list[ChunkTarget], device: str) -> dict:
        runs, columns = [], {k: [] for k in self.columns}
        for t in target if isinstance(target, list) else [target]:  # a job of several chunks: theirs, in order
            runs += self.runs[t.start // self.checkpoints : t.stop // self.checkpoints]
            for k, v in self.columns.items():
                columns[k] += v[t.start : t.stop]
        return {
            "target": target, "widths": self.kind.widths, "schedule": self.schedule,
            "runs": runs, "data": self.shared_data, "columns": columns, "device": device,
            "threads": None if device.startswith("cuda") else 1, "group": self.opts.group,
        }

    def postfix(self, result: dict) -> dict[str, str]:
        fields = {"acc": f"{result['accuracy_mean']:.3f}"}
        if result["diverged_runs"]:
            fields["diverged"] = str(len(result["diverged_runs"]))
        return fields

    def report(self, table, log) -> dict:
        status = np.asarray(table.column("status").to_pylist(), dtype=object)
        runs = table.column("trajectory_id").to_numpy()
        diverged = sorted(set(runs[status != "ok"].tolist()))
        if diverged:
            log(f"warning: {len(diverged)} of {len(set(runs.tolist()))} runs diverged (loss or gradient turned "
                f"non-finite): runs {diverged[:20]}{' ...' if len(diverged) > 20 else ''}. Their checkpoints from "
                f"that step on hold the last finite parameters with status 'diverged' and no test accuracy; the "
                f"normalization statistics leave them out")
        return {"training": {"diverged_runs": diverged, "diverged_networks": int((status != "ok").sum())}}


def train_chunk(target: ChunkTarget | list[ChunkTarget], widths, schedule: TrainSchedule, runs: list[RunSettings],
                data: ClassifierData, columns: dict[str, list], device: str = "cpu", threads: int | None = 1,
                group: int | None = None, progress=None) -> dict | list[dict]:
    """Train ``runs`` and store or return their checkpoints as chunk ``target`` (``progress(fraction)``
    after every step, in-process only). ``target`` a list of chunks (a job of several): ``runs`` and
    ``columns`` are theirs in chunk order, trained together (:func:`train_runs` groups them as it
    would one chunk's: the networks are the same bit for bit), and the result is the list of the
    chunks' results, in order, each finished (moments, and written where the task writes) on its own."""
    if threads is not None:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    targets = target if isinstance(target, list) else [target]
    spec = MlpSpec(tuple(widths))
    sizes = [t.stop - t.start for t in targets]
    weights, biases = host_arrays(spec, sum(sizes), device)  # the job's arrays, filled in place
    results = train_runs(spec, data, runs, schedule, device=device, group=group, progress=progress,
                         out=(weights, biases))
    made, first, row = [], 0, 0
    for t, size in zip(targets, sizes):  # each chunk: its rows of the arrays, its runs, its columns
        last, rows = first, 0
        while rows < size:
            rows += len(results[last].steps)
            last += 1
        if rows != size:
            raise ValueError(f"chunk {t.chunk} holds {size} networks, its runs have {rows} checkpoints")
        params = {}
        for m in range(spec.num_layers):
            params[weight_name(m + 1)] = weights[m][row : row + size]
            params[bias_name(m + 1)] = biases[m][row : row + size]
        chunk_columns = {k: v[row : row + size] for k, v in columns.items()} if len(targets) > 1 else columns
        seconds = (time.perf_counter() - t0) * size / sum(sizes)  # a job's time, shared by its networks
        made.append(_finish_chunk(t, params, results[first:last], chunk_columns, seconds))
        first, row = last, row + size
    return made if isinstance(target, list) else made[0]


def _finish_chunk(target: ChunkTarget, params: dict[str, np.ndarray], results, columns: dict[str, list],
                  seconds: float) -> dict:
    """One chunk's rows from its runs' checkpoints, then :func:`finish_chunk`."""
    accuracy = np.concatenate([r.test_accuracy for r in results])
    loss = np.concatenate([r.train_loss for r in results])
    status = [r.status(c) for r in results for c in range(len(r.steps))]
    rows = pa.table({
        **{k: pa.array(v, type=pa.list_(pa.int64()) if k == "classes" else None) for k, v in columns.items()},
        "test_accuracy": pa.array(accuracy, mask=np.isnan(accuracy)),
        "train_loss": pa.array(loss, mask=np.isnan(loss)),
        "status": pa.array(status, pa.string()),
        "diverged_at": pa.array([r.diverged_at for r in results for _ in r.steps], pa.int64()),
    })
    finals = [r.test_accuracy[-1] for r in results if r.diverged_at is None]
    return finish_chunk(target, params, rows, seconds=seconds,
                        accuracy_mean=float(np.mean(finals)) if finals else float("nan"),
                        diverged_runs=[r.run.run for r in results if r.diverged_at is not None])


ClassifierRecipe.work = staticmethod(train_chunk)
