"""One classifier at a time: a plain ``nn.Sequential`` with its own ``torch.optim.Adam`` and
autograd, on the same batches. The yardstick the batched trainer is checked (tests) and timed
(benchmarks) against."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .data import ClassifierData, batch_plan, normalized
from .mlp import MlpSpec, get_activation, init_params, reference_network
from .runs import RunSettings
from .schedule import ADAM_BETAS, ADAM_EPS, TrainSchedule


def train_one(spec: MlpSpec, data: ClassifierData, run: RunSettings, schedule: TrainSchedule,
              at_checkpoint: Callable[[int, torch.nn.Module], None] | None = None):
    """Returns ``(net, losses)``: the trained ``nn.Sequential`` and its batch losses;
    ``at_checkpoint(step, net)`` is called at each of the schedule's checkpoint steps. Dropout
    masks are PyTorch's own, not the batched trainer's."""
    plan = batch_plan(run, data.train_labels, schedule)
    x = normalized(data, "train")
    w, b = init_params(spec, [run.seed], [run.init_scale])
    net = reference_network([t[0] for t in w], [t[0] for t in b], get_activation(run.activation), run.dropout)
    opt = torch.optim.Adam(net.parameters(), lr=run.lr, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=run.weight_decay)
    classes = torch.tensor(run.classes)
    every_class = run.classes == tuple(range(spec.num_classes))
    losses = []
    checkpoints = set(schedule.checkpoint_steps(plan.steps)) if at_checkpoint else set()
    if 0 in checkpoints:
        at_checkpoint(0, net)
    for t in range(plan.steps):
        keep = plan.targets[t] >= 0
        out = net(x[torch.from_numpy(plan.indices[t][keep])])
        loss = F.cross_entropy(out if every_class else out[:, classes], torch.from_numpy(plan.targets[t][keep]))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if t + 1 in checkpoints:
            at_checkpoint(t + 1, net)
    return net.eval(), np.array(losses, np.float32)


def parameters_of(net: torch.nn.Sequential) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    return [m.weight.detach() for m in linears], [m.bias.detach() for m in linears]
