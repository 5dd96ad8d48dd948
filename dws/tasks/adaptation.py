"""Adapting classifiers to a new domain: the residual map ``v -> v - dv`` and the adapted networks' loss
and accuracy.

**Normalization.** The adapter takes raw weights. It normalizes each parameter tensor (``W1``,
``b1``, ...) with one mean and one std, pooled over all its entries from the store's per-entry
train statistics; its model outputs ``dv`` in those units, and ``dv * std`` (per tensor) is
subtracted from the raw weights. One statistic per tensor, not per entry, keeps the whole map
``v -> v - dv`` exactly equivariant: per-entry statistics differ between the hidden neurons of a
layer, so permuting the neurons would not commute with normalizing them.

**Initialization.** The model's output starts near zero (the paper's mu = 1e-3 on the output
layer), so a fresh adapter leaves every classifier almost unchanged; :func:`small_output` also
zeroes what would add a constant to ``dv`` regardless of mu (the bias of DWSNet's ``d_0' -> d_0``
expansion) and scales a baseline's last linear layer by mu.

**The adapted classifiers** run as one batched computation: stacked weights and batched matmuls
(``zoo.train.mlp.forward_train``, the classifier zoos' own forward), each network on its own images,
and each is judged by the cross-entropy over its own classes' logits (``architecture.output``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dws.weightspace import WeightSpace
from zoo.store import WeightStore
from zoo.store.format import layers_from_arrays
from zoo.train.evaluate import accuracy
from zoo.train.mlp import forward_train, get_activation

from .domain import Domain

Tensor = torch.Tensor
OUTPUT_INIT_SCALE = 1e-3  # the paper's mu for a model whose output parameterizes a network


def tensor_statistics(stats: dict) -> tuple[list[float], list[float]]:
    """Per-tensor ``(means, stds)`` in the order ``W1..WM, b1..bM``, pooled exactly from per-entry
    ``{name: (mean, std)}`` over the same networks (``WeightStore.stats()``)."""
    weights, biases = layers_from_arrays(stats)
    means, stds = [], []
    for mean, std in weights + biases:
        mean, std = np.asarray(mean, np.float64), np.asarray(std, np.float64)
        pooled = mean.mean()
        means.append(float(pooled))
        stds.append(float(np.sqrt(max((std**2 + mean**2).mean() - pooled**2, 1e-16))))
    return means, stds


def small_output(model: nn.Module, mu: float = OUTPUT_INIT_SCALE) -> nn.Module:
    """Make a fresh model's weight-space output start near zero (see the module docstring)."""
    expand = getattr(model, "expand", None)  # DWSNetEquivariant: its last layer is already mu-initialized
    if expand is not None:
        for linear in expand.modules():
            if isinstance(linear, nn.Linear) and linear.bias is not None:
                nn.init.zeros_(linear.bias)
        return model
    last = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]  # a baseline's output layer
    with torch.no_grad():
        last.weight.mul_(mu)
        last.bias.mul_(mu)
    return model


class ResidualAdapter(nn.Module):
    """``v -> v - dv`` on raw weights, ``dv`` from an equivariant weight-space model ``inner``
    (a :class:`dws.nn.DWSNetEquivariant` or a baseline with ``forward_weightspace``).

    The per-tensor statistics are buffers (saved with the model), set from a store by
    :meth:`prepare_store`. Both model hooks of :mod:`dws.tasks.models` pass through to ``inner``'s
    (``mlp-align`` aligns the store it trains on; the adapted networks are then the aligned ones,
    the same functions).
    """

    def __init__(self, inner: nn.Module, widths: Sequence[int]):
        super().__init__()
        self.inner, self.widths = inner, tuple(widths)
        count = 2 * (len(self.widths) - 1)
        self.register_buffer("shift", torch.zeros(count))
        self.register_buffer("scale", torch.ones(count))

    def set_statistics(self, stats: dict) -> None:
        means, stds = tensor_statistics(stats)
        self.shift.copy_(torch.tensor(means))
        self.scale.copy_(torch.tensor(stds))

    def _per_tensor(self, ws: WeightSpace, fn) -> WeightSpace:
        M = len(ws.weights)
        return WeightSpace(tuple(fn(t, self.shift[m], self.scale[m]) for m, t in enumerate(ws.weights)),
                           tuple(fn(t, self.shift[M + m], self.scale[M + m]) for m, t in enumerate(ws.biases)))

    def delta(self, ws: WeightSpace) -> WeightSpace:
        """``dv`` in raw units."""
        x = self._per_tensor(ws, lambda t, mean, std: (t - mean) / std)
        forward = getattr(self.inner, "forward_weightspace", self.inner)
        return self._per_tensor(forward(x), lambda t, mean, std: t * std)

    def forward(self, ws: WeightSpace) -> WeightSpace:
        return ws - self.delta(ws)

    # --------------------------------------------------------- the hooks of dws.tasks.models
    def prepare_store(self, store: WeightStore, folder, log=print) -> WeightStore:
        self.set_statistics(store.stats())
        hook = getattr(self.inner, "prepare_store", None)
        return store if hook is None else hook(store, folder, log)

    def input_transform(self):
        hook = getattr(self.inner, "input_transform", None)
        return None if hook is None else hook()


def classifier_logits(ws: WeightSpace, x: Tensor, activations: Sequence[str]) -> Tensor:
    """Logits ``[K, B, d_M]`` of K classifiers (``ws``, raw) on their own inputs ``x`` ``[K, B, d_0]``:
    one batched forward per activation among them."""
    kinds = list(dict.fromkeys(activations))
    if len(kinds) == 1:
        return forward_train(ws.weights, ws.biases, x, get_activation(kinds[0]))[0]
    out = x.new_empty(x.shape[0], x.shape[1], ws.widths[-1])
    for kind in kinds:
        rows = torch.tensor([i for i, a in enumerate(activations) if a == kind], device=x.device)
        part = ws.map(lambda t: t.index_select(0, rows))
        out = out.index_copy(0, rows, forward_train(part.weights, part.biases, x.index_select(0, rows),
                                                    get_activation(kind))[0])
    return out


def own_class_loss(logits: Tensor, classes: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy over each network's own classes' logits: ``logits`` ``[K, B, d_M]``,
    ``classes`` ``[K, c]``, ``targets`` ``[K, B]`` (the position of the label among the classes)."""
    K, B, _ = logits.shape
    chosen = logits.gather(2, classes.unsqueeze(1).expand(K, B, -1))
    return F.cross_entropy(chosen.flatten(0, 1), targets.flatten())


def accuracies(ws: WeightSpace, classes: Tensor, activations: Sequence[str], x: Tensor, labels: Tensor) -> list[float]:
    """Each classifier's accuracy on the rows of ``x`` whose label is one of its classes
    (``zoo.train.evaluate.accuracy``: the rule the store's ``test_accuracy`` follows)."""
    ws, classes = ws.map(lambda t: t.detach().cpu()), classes.cpu()
    out, rows_of = [], {}
    for k in range(ws.batch_size):
        key = tuple(classes[k].tolist())
        if key not in rows_of:
            rows = torch.isin(labels, classes[k]).nonzero().squeeze(1)
            rows_of[key] = (x[rows], labels[rows])
        images, truth = rows_of[key]
        out.append(accuracy([w[k] for w in ws.weights], [b[k] for b in ws.biases], get_activation(activations[k]),
                            images, truth, classes[k]))
    return out


class Adaptation:
    """What the ``adapt`` task needs of one store: its images (:class:`~dws.tasks.domain.Domain`),
    each network's classes and activation by store index, and the images per network and step."""

    def __init__(self, store: WeightStore, data_root: str | None = None, image_batch: int = 128):
        self.domain = Domain.of_store(store, data_root)  # refuses a store of other networks first
        table = store.networks
        classes = table.column("classes").to_pylist()
        if len({len(c) for c in classes}) != 1:
            raise ValueError(f"{store.root}: networks learn different numbers of classes; adaptation batches "
                             f"networks that each see the same number of images per class")
        self.classes = torch.tensor(classes, dtype=torch.int64)
        default = store.manifest["architecture"].get("activation", "relu")
        self.activations = (table.column("activation").to_pylist() if "activation" in table.column_names
                            else [default] * store.num_networks)
        self.per_class = -(-image_batch // self.classes.shape[1])  # ceil: every class equally often
        self._before: dict[tuple[str, int], float] = {}  # unadapted accuracies, computed once

    def loss(self, model: nn.Module, ws: WeightSpace, index: Tensor) -> Tensor:
        """Mean own-class cross-entropy of the adapted networks ``model(ws)`` on freshly corrupted images."""
        index = index.cpu()
        classes = self.classes[index]
        x, targets = self.domain.training_images(classes, self.per_class)
        device = ws.weights[0].device
        logits = classifier_logits(model(ws), x.to(device), [self.activations[i] for i in index.tolist()])
        return own_class_loss(logits, classes.to(device), targets.to(device))

    @torch.no_grad()
    def evaluate(self, model: nn.Module, batches, device, images: str) -> dict:
        """Mean accuracy of the networks of ``batches`` (raw weights, target = store index) on the fixed
        image set ``images`` (:meth:`Domain.fixed_images`), adapted by ``model`` and as they are."""
        model.eval()
        x, labels = self.domain.fixed_images(images)
        after, before = [], []
        for batch in batches:
            index = batch.target.tolist()
            classes, acts = self.classes[batch.target], [self.activations[i] for i in index]
            after += accuracies(model(batch.ws.to(device)), classes, acts, x, labels)
            todo = [k for k, i in enumerate(index) if (images, i) not in self._before]
            if todo:
                rows = torch.tensor(todo)
                raw = batch.ws.map(lambda t: t.index_select(0, rows))
                for k, acc in zip(todo, accuracies(raw, classes[rows], [acts[k] for k in todo], x, labels)):
                    self._before[images, index[k]] = acc
            before += [self._before[images, i] for i in index]
        return {"accuracy": float(np.mean(after)), "accuracy_before": float(np.mean(before)),
                "gain": float(np.mean(after) - np.mean(before))}
