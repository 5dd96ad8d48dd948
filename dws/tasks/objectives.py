"""What a model is trained to do on a store: the target column(s), the loss and the metrics.

* ``classify``: INR classification (target ``label``), cross-entropy, accuracy.
* ``regress``: e.g. sine frequency (target ``frequency``), MSE.
* ``ssl``: SimCLR-style NT-Xent on two noisy/masked views (temperature 0.1) into a 16-dim
  embedding; judged by a linear regressor from the embedding to the targets (test MSE).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from dws.weightspace import WeightSpace

Tensor = torch.Tensor


@dataclass(frozen=True)
class Task:
    name: str
    target: str  # comma-separated store columns
    metric: str  # the validation metric used for model selection
    mode: str  # "max" or "min"

    def better(self, a: float, b: float | None) -> bool:
        return b is None or (a > b if self.mode == "max" else a < b)


CLASSIFY = Task("classify", "label", "accuracy", "max")
REGRESS = Task("regress", "frequency", "mse", "min")
SSL = Task("ssl", "amplitude,frequency", "probe_mse", "min")
TASKS = {t.name: t for t in (CLASSIFY, REGRESS, SSL)}
SSL_EMBEDDING = 16


def get_task(name: str, target: str | None = None) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from {sorted(TASKS)}")
    task = TASKS[name]
    return task if target is None else Task(task.name, target, task.metric, task.mode)


def output_size(task: Task, num_classes: int | None = None) -> int:
    if task.name == "classify":
        if not num_classes:
            raise ValueError("classification needs the number of classes")
        return num_classes
    if task.name == "regress":
        return len(task.target.split(","))
    return SSL_EMBEDDING


def supervised_loss(task: Task, output: Tensor, target: Tensor) -> Tensor:
    if task.name == "classify":
        return F.cross_entropy(output, target)
    return F.mse_loss(output, target.view_as(output).float())


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


def supervised_metrics(task: Task, outputs: Tensor, targets: Tensor, loss: float) -> dict:
    if task.name == "classify":
        return {"loss": loss, "accuracy": float((outputs.argmax(1) == targets).float().mean())}
    return {"loss": loss, "mse": float(F.mse_loss(outputs, targets.view_as(outputs).float()))}


def linear_probe_mse(train_z: np.ndarray, train_y: np.ndarray, eval_z: np.ndarray, eval_y: np.ndarray) -> float:
    """Test MSE of a least-squares linear regressor from embeddings to targets (the paper's probe)."""
    from sklearn.linear_model import LinearRegression

    reg = LinearRegression().fit(train_z, train_y)
    return float(np.mean((reg.predict(eval_z) - eval_y) ** 2))
