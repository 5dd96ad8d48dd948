"""A classifier zoo's training schedule: Adam, batch size, length, and which checkpoints are kept."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


@dataclass(frozen=True)
class TrainSchedule:
    epochs: int
    batch_size: int
    lr: float  # the rate of every run unless diversity samples one per run
    checkpoint_every: int | None = None  # keep a checkpoint every N steps (None: the final network only)
    steps: int | None = None  # a fixed number of steps instead of ``epochs`` passes (quick looks, tests)

    def total_steps(self, pool_size: int) -> int:
        """Steps of a run whose classes have ``pool_size`` training images."""
        return self.steps if self.steps is not None else self.epochs * math.ceil(pool_size / self.batch_size)

    def checkpoint_steps(self, total: int) -> list[int]:
        """Steps (optimizer updates done) at which a network is stored: ``0, N, 2N, ...`` and the
        last step, or the last step alone."""
        if self.checkpoint_every is None:
            return [total]
        steps = list(range(0, total + 1, self.checkpoint_every))
        return steps if steps[-1] == total else steps + [total]

    def to_manifest(self) -> dict:
        return {
            **asdict(self),
            "optimizer": f"torch.optim.Adam(lr, betas={ADAM_BETAS}, eps={ADAM_EPS}, weight_decay) per network",
            "loss": "cross-entropy over the logits of the network's classes (see architecture.output), mean over "
                    "the batch",
            "length": "steps if set, else epochs * ceil(images of the run's classes / batch_size)",
            "checkpoints": "every checkpoint_every steps from step 0 (the initialization), plus the last step"
                           if self.checkpoint_every else "the final network only",
        }
