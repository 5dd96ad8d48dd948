"""What a model is trained to do on a store: the target column(s), the output, the loss and the metrics.

* ``classify``: INR classification (target ``label``), cross-entropy, accuracy.
* ``regress``: e.g. sine frequency (target ``frequency``) or a classifier's test accuracy (target
  ``test_accuracy``), MSE; one target column also gets Kendall's tau between predictions and targets.
* ``ssl``: SimCLR-style NT-Xent on two noisy/masked views (temperature 0.1) into a 16-dim
  embedding; judged by a linear regressor from the embedding to the targets (test MSE).
* ``adapt``: classifier weights ``v`` -> residual weights ``dv`` of the same shapes; the adapted
  classifiers ``v - dv`` are trained and judged on corrupted images of their own classes
  (:mod:`dws.tasks.adaptation`, :mod:`dws.tasks.domain`).

A task is one :class:`Task` subclass registered in :data:`TASKS`; the trainer, the loaders and
the run directory only call its methods. Its four fields are what ``config.json`` records.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from dws.stream import read_targets, usable_mask
from dws.weightspace import WeightSpace
from zoo.store import StoreError, WeightStore
from zoo.store.format import values_per_network

from .adaptation import Adaptation

Tensor = torch.Tensor
SSL_EMBEDDING = 16


@dataclass(frozen=True)
class Reported:
    """A metric as a person reads it (the CLI's summary, ``zoo eval``, ``predictions.png``, the README),
    in the paper's unit: ``scale`` times the value stored under ``key`` in metrics dicts."""

    key: str
    label: str
    scale: float = 1.0

    def of(self, metrics: dict) -> float:
        return self.scale * metrics[self.key]


@dataclass(frozen=True)
class Task:
    name: str
    target: str  # comma-separated store columns
    metric: str  # the validation metric used for model selection
    mode: str  # "max" or "min"

    full_batches: ClassVar[bool] = False  # train on full batches only (the last, shorter one is dropped)
    probe: ClassVar[bool] = False  # evaluation also needs the un-augmented train split (``probe`` batches)
    # the model maps networks to residual weights of the same shapes: it takes raw, un-augmented networks
    # (its output is subtracted from them), and the task evaluates it itself (:meth:`evaluate`)
    outputs_weights: ClassVar[bool] = False

    def bind(self, store: WeightStore, data_root: str | None = None, image_batch: int = 128) -> "Task":
        """The task for ``store`` (a task that needs more than the networks, e.g. images, loads it here)."""
        return self

    def better(self, a: float, b: float | None) -> bool:
        return b is None or (a > b if self.mode == "max" else a < b)

    @property
    def targets(self) -> list[str]:
        return [name.strip() for name in self.target.split(",")]

    def check_store(self, store: WeightStore, ranges: dict[str, tuple[int, int]]) -> None:
        """Refuse a store without this task's targets on the networks ``ranges`` (split -> start, stop)
        that are learned from (:func:`dws.stream.usable_mask`)."""
        for start, stop in ranges.values():
            try:
                read_targets(store, self.targets, start, stop, usable_mask(store, start, stop))
            except ValueError as exc:
                raise ValueError(f"--task {self.name}: {exc}{_fitting_task_hint(store, self)}") from None

    def num_classes(self, store: WeightStore) -> int | None:
        return None

    @property
    def scalar_predictions(self) -> bool:
        """Whether each network gets one predicted number (the run directory then plots predicted vs actual)."""
        return False

    def output_size(self, store: WeightStore) -> int:
        raise NotImplementedError

    def target_scale(self, store: WeightStore, start: int, stop: int,
                     keep: np.ndarray | None = None) -> list[list[float]] | None:
        """``[means, stds]`` of the targets of networks ``start..stop-1`` that are learned from (``keep``, a
        mask over them: those, e.g. ``--train-limit``'s subset), for a model whose outputs are standardized
        targets (:class:`dws.tasks.models.TargetScale`); None: not such a task."""
        return None

    def loss(self, model, ws: WeightSpace, target: Tensor, temperature: float) -> Tensor:
        """The training loss of one batch (``temperature``: the contrastive tasks')."""
        raise NotImplementedError

    def metrics(self, outputs: Tensor, targets: Tensor, probe: tuple[Tensor, Tensor] | None) -> dict:
        """Metrics of a split's ``outputs`` (``probe``: the train split's outputs and targets, if asked)."""
        raise NotImplementedError

    def reported(self) -> tuple[Reported, ...]:
        """The metrics shown to a person, in the paper's units (stored metrics stay unscaled)."""
        return (Reported(self.metric, self.metric),)

    def report(self, metrics: dict) -> str:
        """One split's metrics in the paper's units, e.g. ``100×MSE 2.462, Kendall τ 0.778``."""
        return ", ".join(f"{r.label} {r.of(metrics):.4g}" for r in self.reported() if r.key in metrics)


class Classify(Task):
    def num_classes(self, store):
        labels = store.networks.column("label").to_numpy()
        if labels.min() < 0:
            raise StoreError(f"{store.root} has networks without a label; it is not a classification store")
        return int(labels.max()) + 1

    def output_size(self, store):
        return self.num_classes(store)

    def loss(self, model, ws, target, temperature):
        return F.cross_entropy(model(ws), target)

    def metrics(self, outputs, targets, probe):
        loss = float(F.cross_entropy(outputs, targets))
        return {"loss": loss, "accuracy": float((outputs.argmax(1) == targets).float().mean())}


class Regress(Task):
    def output_size(self, store):
        return len(self.targets)

    @property
    def scalar_predictions(self):
        return len(self.targets) == 1

    def target_scale(self, store, start, stop, keep=None):
        keep = usable_mask(store, start, stop) if keep is None else keep
        values = read_targets(store, self.targets, start, stop, keep).double()
        values = values.view(len(values), -1)
        std = values.std(dim=0, correction=0)
        std = torch.where(std > 0, std, torch.ones_like(std))  # a constant target (or one network): its offset alone
        return [values.mean(dim=0).tolist(), std.tolist()]

    def loss(self, model, ws, target, temperature):
        output = model(ws)
        return F.mse_loss(output, target.view_as(output).float())

    def metrics(self, outputs, targets, probe):
        mse = float(F.mse_loss(outputs, targets.view_as(outputs).float()))
        if not self.scalar_predictions:
            return {"loss": mse, "mse": mse}
        return {"loss": mse, "mse": mse, "kendall_tau": kendall_tau(outputs.flatten(), targets.flatten())}

    def reported(self):
        """The paper's units: 100 x MSE for accuracies (its generalization-prediction figure), MSE for
        other targets (its sine-regression figure); Kendall's tau where one number is predicted."""
        mse = (Reported("mse", "100×MSE", 100.0) if all(t.endswith("accuracy") for t in self.targets)
               else Reported("mse", "MSE"))
        return (mse, Reported("kendall_tau", "Kendall τ")) if self.scalar_predictions else (mse,)


class SelfSupervised(Task):
    full_batches = True  # NT-Xent's negatives are the rest of the batch
    probe = True

    def output_size(self, store):
        return SSL_EMBEDDING

    def loss(self, model, ws, target, temperature):
        return nt_xent(model(ssl_views(ws, None)), model(ssl_views(ws, None)), temperature)

    def metrics(self, outputs, targets, probe):
        train_z, train_y = probe
        return {"probe_mse": linear_probe_mse(train_z.numpy(), train_y.numpy(), outputs.numpy(), targets.numpy())}

    def reported(self):
        return (Reported("probe_mse", "linear-probe MSE"),)


class Adapt(Task):
    """Per store: :meth:`bind` loads the images (:class:`~dws.tasks.adaptation.Adaptation`); the
    target is the store index, through which each network's classes and activation are found."""

    outputs_weights = True
    adaptation = None  # set on the bound copy

    def bind(self, store, data_root=None, image_batch=128):
        bound = replace(self)
        object.__setattr__(bound, "adaptation", Adaptation(store, data_root, image_batch))  # not a field
        return bound

    def check_store(self, store, ranges):
        status = store.networks.column("status").to_pylist() if "status" in store.networks.column_names else []
        bad = [i for start, stop in ranges.values() for i in range(start, stop) if status and status[i] != "ok"]
        if bad:
            raise ValueError(f"--task adapt: {len(bad)} network(s) of {store.root} did not train normally "
                             f"(status not ok, e.g. {bad[:5]}); adaptation needs trained classifiers")

    def output_size(self, store):
        return values_per_network(store.manifest)

    def loss(self, model, ws, target, temperature):
        return self.adaptation.loss(model, ws, target)

    def evaluate(self, model, loader, device) -> dict:
        """Accuracy of the adapted and the unadapted networks of ``loader`` on fixed corrupted images:
        the test images for the test split, the held-out training images otherwise."""
        return self.adaptation.evaluate(model, loader, device, "test" if loader.split == "test" else "val")


CLASSIFY = Classify("classify", "label", "accuracy", "max")
REGRESS = Regress("regress", "frequency", "mse", "min")
SSL = SelfSupervised("ssl", "amplitude,frequency", "probe_mse", "min")
ADAPT = Adapt("adapt", "index", "accuracy", "max")
TASKS = {t.name: t for t in (CLASSIFY, REGRESS, SSL, ADAPT)}


def _fitting_task_hint(store: WeightStore, task: Task) -> str:
    """What ``zoo train`` does on ``store`` without --task, when that is another task or target."""
    from .options import TrainOptions, with_task_defaults

    fitting = with_task_defaults(TrainOptions(store=str(store.root)))
    target = fitting.target or TASKS[fitting.task].target
    if (fitting.task, target) == (task.name, task.target):
        return ""
    return f"; without --task, zoo train does what this store is for: --task {fitting.task} --target {target}"


def get_task(name: str, target: str | None = None) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from {sorted(TASKS)}")
    task = TASKS[name]
    return task if target is None else replace(task, target=target)


def nt_xent(z1: Tensor, z2: Tensor, temperature: float = 0.1) -> Tensor:
    """SimCLR's normalized-temperature cross entropy over the 2B views of a batch."""
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    sim = z @ z.T / temperature
    n = z1.shape[0]
    sim.fill_diagonal_(float("-inf"))
    positives = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    return F.cross_entropy(sim, positives)


def ssl_views(ws: WeightSpace, generator: torch.Generator | None = None,
              sigma: float = 0.2, mask_p: float = 0.5) -> WeightSpace:
    """One random view: Gaussian noise (sigma) and random masking (each entry kept with 1 - p)."""

    def view(t: Tensor) -> Tensor:
        noise = torch.randn(t.shape, generator=generator, device=t.device) * sigma
        keep = (torch.rand(t.shape, generator=generator, device=t.device) >= mask_p).to(t.dtype)
        return (t + noise) * keep

    return ws.map(view)


def kendall_tau(predictions: Tensor, targets: Tensor) -> float:
    """Kendall's rank correlation (tau-b, ties counted as scipy does); NaN when either side is constant.

    The rank metric of generalization prediction (Unterthiner et al. 2020): does the model order
    networks by their test accuracy, whatever its error in absolute terms.
    """
    from scipy.stats import kendalltau

    return float(kendalltau(predictions.double().numpy(), targets.double().numpy()).statistic)


def linear_probe_mse(train_z: np.ndarray, train_y: np.ndarray, eval_z: np.ndarray, eval_y: np.ndarray) -> float:
    """Test MSE of a least-squares linear regressor from embeddings to targets (the paper's probe)."""
    from sklearn.linear_model import LinearRegression

    reg = LinearRegression().fit(train_z, train_y)
    return float(np.mean((reg.predict(eval_z) - eval_y) ** 2))
