"""Adam over stacked per-network parameters, with a per-network "still training" mask.

Adam is elementwise, so one Adam over ``[K, ...]`` tensors whose loss is the sum of the K
per-network losses is exactly K independent Adams. The update follows ``torch.optim.Adam``'s
formula (same bias correction, same epsilon placement, weight decay added to the gradient) so a
batched fit follows the trajectory of fitting each network alone with ``torch.optim.Adam``.
Networks whose mask is off do not move. The learning rate and the weight decay are one number
for all networks or one per network (classifier zoos sample them per run).
"""

from __future__ import annotations

import math

import torch

from . import native

Tensor = torch.Tensor


class MaskedAdam:
    def __init__(self, params: list[Tensor], lr: float | Tensor, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float | Tensor = 0.0):
        self.params = params
        self.lr, self.betas, self.eps = lr, betas, eps
        self.weight_decay = weight_decay
        self.exp_avg = [torch.zeros_like(p) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]
        self.steps = 0

    @torch.no_grad()
    def step(self, grads: list[Tensor], active: Tensor | None = None) -> None:
        """One update; ``active`` is a bool ``[K]`` mask of networks allowed to move."""
        self.steps += 1
        beta1, beta2 = self.betas
        bias_correction1 = 1 - beta1**self.steps
        bias_correction2_sqrt = math.sqrt(1 - beta2**self.steps)
        step_size = self.lr / bias_correction1  # a [K] tensor where the rate is per network
        grads = self._decayed(grads)
        if self._native_step(grads, active, step_size, bias_correction2_sqrt):
            return
        # One multi-tensor op per stage (as torch.optim.Adam's foreach path): a handful of small
        # parameter tensors would otherwise cost more in dispatch than in arithmetic.
        torch._foreach_lerp_(self.exp_avg, grads, 1 - beta1)
        torch._foreach_mul_(self.exp_avg_sq, beta2)
        torch._foreach_addcmul_(self.exp_avg_sq, grads, grads, value=1 - beta2)
        denom = torch._foreach_sqrt(self.exp_avg_sq)
        torch._foreach_div_(denom, bias_correction2_sqrt)
        torch._foreach_add_(denom, self.eps)
        updates = torch._foreach_div(self.exp_avg, denom)
        per_network = isinstance(step_size, Tensor)
        if active is not None or per_network:
            scale = torch.ones(self.params[0].shape[0], device=self.params[0].device) if active is None \
                else active.to(self.params[0].dtype)
            if per_network:
                scale = scale * step_size.to(scale)
            for p, update in zip(self.params, updates):
                update.mul_(scale.view(-1, *([1] * (p.dim() - 1))))
        torch._foreach_add_(self.params, updates, alpha=-1.0 if per_network else -step_size)

    def _decayed(self, grads: list[Tensor]) -> list[Tensor]:
        """``grad + weight_decay * param`` (torch.optim.Adam's L2 term); new tensors, the caller's
        gradients are left as they are."""
        wd = self.weight_decay
        if not isinstance(wd, Tensor):
            return grads if wd == 0 else [g.add(p, alpha=wd) for g, p in zip(grads, self.params)]
        if not bool((wd != 0).any()):
            return grads
        return [torch.addcmul(g, p, wd.to(p).view(-1, *([1] * (p.dim() - 1)))) for g, p in zip(grads, self.params)]

    def _native_step(self, grads, active, step_size, bias_correction2_sqrt: float) -> bool:
        """The same update as one C pass per tensor (:mod:`zoo.fit.native`) for float32 CPU
        tensors; False where that does not apply. Networks that may not move are skipped outright
        (their moments are never used again). Per-network rates take one call per network."""
        tensors = [*self.params, *grads, *self.exp_avg, *self.exp_avg_sq]
        if not all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors):
            return False
        lib = native.library()
        if lib is None:
            return False
        mask = None if active is None else active.to(torch.uint8).contiguous()
        moving = [True] * self.params[0].shape[0] if active is None else active.tolist()
        beta1, beta2 = self.betas
        for p, g, m, v in zip(self.params, grads, self.exp_avg, self.exp_avg_sq):
            K = p.shape[0]
            n = p.numel() // max(K, 1)
            if not isinstance(step_size, Tensor):
                lib.zoo_adam(K, n, p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(),
                             None if mask is None else mask.data_ptr(), beta1, beta2, step_size,
                             bias_correction2_sqrt, self.eps)
                continue
            size = p.element_size() * n
            for k, (size_k, moves) in enumerate(zip(step_size.tolist(), moving)):
                if moves:
                    lib.zoo_adam(1, n, p.data_ptr() + k * size, g.data_ptr() + k * size, m.data_ptr() + k * size,
                                 v.data_ptr() + k * size, None, beta1, beta2, size_k, bias_correction2_sqrt, self.eps)
        return True

    def select(self, keep: Tensor) -> None:
        """Drop the networks not in ``keep`` (index tensor) from the optimizer state."""
        self.exp_avg = [m[keep] for m in self.exp_avg]
        self.exp_avg_sq = [v[keep] for v in self.exp_avg_sq]
        if isinstance(self.lr, Tensor):
            self.lr = self.lr[keep]
        if isinstance(self.weight_decay, Tensor):
            self.weight_decay = self.weight_decay[keep]
