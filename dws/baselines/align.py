"""Baseline (iii): the flat MLP on inputs aligned to one reference network.

Weight matching (Ainsworth et al. 2022, "Git Re-Basin", Alg. 1) picks the group element that
brings a network closest (in L2) to a reference, i.e. maximises ``<g . W, W_ref>``. That is a
quadratic assignment problem, solved approximately by coordinate descent: one hidden layer at a
time, in random order, with the other permutations fixed the problem is a linear assignment
(``scipy.optimize.linear_sum_assignment``); repeat until a full pass improves nothing. One
addition to Alg. 1: the descent may start from a greedy first-to-last matching instead of the
identity (whichever is closer), which recovers exact permuted copies that the identity start misses
for the narrow input/output layers of INRs.

The reference comes from MergeMany on a random subsample of the training set, as in the DWSNets
paper's appendix ("Approximation for model alignment": 1000 models, error 1e-3).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from dws.baselines.common import num_weights
from dws.baselines.mlp import MLPBaseline
from dws.stream.batch import weightspace_from_arrays
from dws.stream.mapped import write_mapped_store
from dws.stream.rows import usable_mask
from dws.weightspace import WeightSpace, _gather_dim
from zoo.store import StoreError, WeightStore

Tensor = torch.Tensor


def _select(ws: WeightSpace, index) -> WeightSpace:
    return ws.map(lambda t: t[index])


def _layer_scores(
    ws: WeightSpace, ref: WeightSpace, perms: Sequence[Tensor], k: int, outgoing: bool = True
) -> Tensor:
    """``S[b, i, p]``: agreement with the reference of putting neuron ``p`` of network ``b`` at
    position ``i`` of hidden layer ``k + 1`` (its incoming row, bias and, if ``outgoing``, outgoing
    column, with the neighbouring layers already permuted). ``sum_i S[b, i, perm[i]]`` is the part
    of ``<g . W_b, W_ref>`` that depends on ``perm``."""
    batch = ws.batch_size
    ref = ref.map(lambda t: t.expand(batch, *t.shape[1:]))  # bmm is faster than broadcasting
    w_in = ws.weights[k]
    if k > 0:
        w_in = _gather_dim(w_in, perms[k - 1], 2)
    scores = torch.bmm(ref.weights[k], w_in.transpose(1, 2))
    scores = torch.baddbmm(scores, ref.biases[k].unsqueeze(2), ws.biases[k].unsqueeze(1))
    if outgoing:
        w_out = ws.weights[k + 1]
        if k + 1 < ws.num_layers - 1:
            w_out = _gather_dim(w_out, perms[k + 1], 1)
        scores = torch.baddbmm(scores, ref.weights[k + 1].transpose(1, 2), w_out)
    return scores


def _inner(ws: WeightSpace, ref: WeightSpace, perms: Sequence[Tensor]) -> Tensor:
    """``<g . W_b, W_ref>`` per sample."""
    return (ws.permute(perms).flatten() * ref.flatten()).sum(1)


def _forward_start(ws: WeightSpace, ref: WeightSpace) -> list[Tensor]:
    """Starting point for coordinate descent: match layers first to last by incoming weights and
    bias only (the input layer is never permuted, so each step sees correctly ordered columns).
    Recovers a permuted copy of ``ref`` exactly, where starting from the identity often stalls
    when the input and output widths are small (INRs); the caller keeps the better start."""
    perms: list[Tensor] = []
    for k in range(ws.num_layers - 1):
        perms.append(_assign(_layer_scores(ws, ref, perms, k, outgoing=False)))
    return perms


def _assign(scores: Tensor) -> Tensor:
    """Per-sample maximum-weight assignment ``[B, d, d] -> [B, d]`` (one LSA call per sample)."""
    from scipy.optimize import linear_sum_assignment  # here: scipy.optimize takes ~1 s to import, and every
    # `zoo train` imports this module, aligning or not
    cost = scores.detach().cpu().numpy()
    cols = np.stack([linear_sum_assignment(c, maximize=True)[1] for c in cost])
    return torch.from_numpy(cols).to(scores.device)


def weight_matching(
    ws: WeightSpace,
    ref: WeightSpace,
    max_iter: int = 100,
    generator: torch.Generator | None = None,
) -> list[Tensor]:
    """Per-sample permutations ``[B, d_k]`` such that ``ws.permute(perms)`` is close to ``ref``.

    ``ref`` holds one network (batch 1) or one per sample. Starts from the better of the identity
    and :func:`_forward_start` and accepts only strict improvements, so the distance to ``ref``
    never grows beyond that of the unaligned input. Cost per pass: one batched
    ``[B, d, d]`` score computation and ``B`` LSA calls (``O(d^3)`` each) per hidden layer;
    samples stop being processed once a full pass leaves them unchanged.
    """
    if ref.widths != ws.widths:
        raise ValueError(f"reference widths {ref.widths} differ from input widths {ws.widths}")
    if ref.batch_size not in (1, ws.batch_size):
        raise ValueError(
            f"reference batch must be 1 or {ws.batch_size}, got {ref.batch_size}"
        )
    device = ws.weights[0].device
    ws = ws.map(lambda t: t.detach().double())  # float64: ties and improvements compare exactly
    ref = ref.map(lambda t: t.detach().to(device, torch.float64))
    hidden = ws.widths[1:-1]
    perms = [torch.arange(d, device=device).repeat(ws.batch_size, 1) for d in hidden]
    start = _forward_start(ws, ref)
    better = _inner(ws, ref, start) > _inner(ws, ref, perms)
    perms = [torch.where(better.unsqueeze(1), s, p) for s, p in zip(start, perms)]
    active = torch.arange(ws.batch_size, device=device)
    for _ in range(max_iter):
        if not hidden or active.numel() == 0:
            break
        sub = _select(ws, active)
        sub_ref = ref if ref.batch_size == 1 else _select(ref, active)
        sub_perms = [p[active] for p in perms]
        improved = torch.zeros(active.numel(), dtype=torch.bool, device=device)
        for k in torch.randperm(len(hidden), generator=generator).tolist():
            scores = _layer_scores(sub, sub_ref, sub_perms, k)
            new = _assign(scores)
            old_total = scores.gather(2, sub_perms[k].unsqueeze(2)).sum((1, 2))
            new_total = scores.gather(2, new.unsqueeze(2)).sum((1, 2))
            better = new_total > old_total + 1e-12 * old_total.abs().clamp_min(1.0)
            sub_perms[k] = torch.where(better.unsqueeze(1), new, sub_perms[k])
            improved |= better
        for p, sp in zip(perms, sub_perms):
            p[active] = sp
        active = active[improved]
    return perms


def align(ws: WeightSpace, ref: WeightSpace, **kw) -> WeightSpace:
    """``ws`` moved by the group element :func:`weight_matching` finds (same functions)."""
    return ws.permute(weight_matching(ws, ref, **kw))


def merge_many(
    ws: WeightSpace,
    tol: float = 1e-3,
    max_iter: int = 100,
    subsample: int = 1000,
    generator: torch.Generator | None = None,
) -> WeightSpace:
    """Ainsworth et al.'s MergeMany: a reference network (batch 1) for aligning ``ws``.

    On a random subsample of ``subsample`` networks, align each network in turn to the mean of the
    others, sweeping until no network's distance to that mean drops by more than ``tol``
    (absolute L2); return the mean of the aligned networks. Each sweep costs one
    :func:`weight_matching` per network, which is why the paper subsamples.
    """
    with _one_thread():
        return _merge_many(ws, tol, max_iter, subsample, generator)


@contextmanager
def _one_thread():
    """MergeMany runs thousands of tiny matrix products; thread hand-offs would dominate them (a
    10x slow-down on a busy machine), so it runs on one intra-op thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def subsample_indices(n: int, subsample: int, generator: torch.Generator) -> Tensor | None:
    """The ``subsample`` of ``n`` networks MergeMany works on (None: all of them, no draw made)."""
    return torch.randperm(n, generator=generator)[:subsample] if n > subsample else None


def _merge_many(ws, tol, max_iter, subsample, generator) -> WeightSpace:
    dtype, widths = ws.weights[0].dtype, ws.widths
    ws = ws.map(lambda t: t.detach().double())
    pick = subsample_indices(ws.batch_size, subsample, generator)
    if pick is not None:
        ws = _select(ws, pick.to(ws.weights[0].device))
    n = ws.batch_size
    aligned = ws.flatten().clone()
    total = aligned.sum(0)
    for _ in range(max_iter if n > 1 else 0):
        progress = False
        for i in torch.randperm(n, generator=generator).tolist():
            others = (total - aligned[i]) / (n - 1)
            model = WeightSpace.unflatten(aligned[i : i + 1], widths)
            target = WeightSpace.unflatten(others.unsqueeze(0), widths)
            new = align(model, target, generator=generator).flatten()[0]
            before, after = (others - aligned[i]).norm(), (others - new).norm()
            total += new - aligned[i]
            aligned[i] = new
            progress = progress or bool(after < before - tol)
        if not progress:
            break
    return WeightSpace.unflatten((total / n).unsqueeze(0), widths).map(lambda t: t.to(dtype))


class AlignedMLP(MLPBaseline):
    """:class:`MLPBaseline` on inputs aligned to a MergeMany reference built by :meth:`prepare`.

    Takes :class:`MLPBaseline`'s arguments (``hidden``, ``n_layers``, ``dropout``, ``equivariant``)
    as keywords, plus ``subsample``/``tol``/``max_iter`` for :func:`merge_many` and ``seed`` for its
    randomness and the (seeded per call, hence deterministic) layer order of weight matching.

    By default ``forward`` aligns every batch, costing ``B * (M - 1)`` LSA calls per pass (a few
    passes; milliseconds for 32-wide layers, but it runs on CPU). To pay it once per sample
    instead, set ``align_in_forward=False`` and feed ``model.align(ws)`` precomputed for the
    whole data set: ``zoo train`` does so through :meth:`prepare_store` and ``zoo eval`` through
    :meth:`input_transform` (the hooks of :mod:`dws.tasks.models`). The reference is a buffer, so
    it is saved with the ``state_dict``.
    """

    ALIGNED_STORE = "aligned-store"  # the folder prepare_store derives in a run directory

    def __init__(
        self,
        widths: Sequence[int],
        out_features: int | None = None,
        *,
        subsample: int = 1000,
        tol: float = 1e-3,
        max_iter: int = 100,
        seed: int = 0,
        align_in_forward: bool = True,
        **mlp_kw,
    ):
        super().__init__(widths, out_features, **mlp_kw)
        self.merge_kw = dict(subsample=subsample, tol=tol, max_iter=max_iter)
        self.seed = seed
        self.align_in_forward = align_in_forward
        self.register_buffer("reference", torch.zeros(1, num_weights(self.widths)))
        self.register_buffer("prepared", torch.tensor(False))

    def prepare(self, train_ws: WeightSpace, generator: torch.Generator | None = None) -> None:
        """Build the reference network from the training set (MergeMany on a subsample, on CPU).

        ``generator``: one already seeded (and advanced past the subsample's draw, see
        :meth:`prepare_store`); by default a fresh one seeded with ``seed``.
        """
        gen = generator if generator is not None else torch.Generator().manual_seed(self.seed)
        train_ws = self.plain(train_ws).to("cpu")  # LSA-bound: no use for an accelerator here
        ref = merge_many(train_ws, generator=gen, **self.merge_kw)
        self.reference.copy_(ref.flatten())
        self.prepared.fill_(True)

    def group_element(self, ws: WeightSpace) -> list[Tensor]:
        """The per-sample permutations aligning ``ws`` to the reference."""
        if not self.prepared:
            raise RuntimeError("AlignedMLP needs prepare(train_ws) before aligning inputs")
        ref = WeightSpace.unflatten(self.reference, self.widths)
        gen = torch.Generator().manual_seed(self.seed)
        return weight_matching(self.plain(ws), ref, self.merge_kw["max_iter"], generator=gen)

    def align(self, ws: WeightSpace) -> WeightSpace:
        """``ws`` (without channel dim) aligned to the reference: precompute with this."""
        ws = self.plain(ws)
        return ws.permute(self.group_element(ws))

    def transform_input(self, ws: WeightSpace) -> tuple[WeightSpace, list[Tensor] | None]:
        if not self.align_in_forward:
            return ws, None
        perms = self.group_element(ws)
        return ws.permute(perms), perms

    # --------------------------------------------------------- the hooks of dws.tasks.models
    def prepare_store(self, store: WeightStore, folder: Path, log=print) -> WeightStore:
        """Every network of ``store`` aligned to the reference, as a store in ``folder/aligned-store``.

        The first call builds the reference from the train split and writes the aligned networks
        with the reference and its settings recorded in the manifest; later calls with the same
        store and settings read both back instead (other seeds, data-parallel workers, a rerun).
        Afterwards ``forward`` takes the aligned networks as they are.
        """
        root = Path(folder) / self.ALIGNED_STORE
        settings = {"derived_from": str(store.root.resolve()), "seed": self.seed, **self.merge_kw}
        aligned = _open_if_made_with(root, settings)
        if aligned is not None:
            reference = aligned.manifest["generation"]["alignment"]["reference"]
            self.reference.copy_(torch.tensor(reference, dtype=self.reference.dtype).view_as(self.reference))
            self.prepared.fill_(True)
        else:
            t0 = time.perf_counter()
            gen = torch.Generator().manual_seed(self.seed)
            subsample = self.reference_networks(store, gen)
            log(f"mlp-align: building the MergeMany reference from {len(subsample)} train networks")
            self.prepare(weightspace_from_arrays(store.read_rows(subsample)), generator=gen)
            log(f"mlp-align: reference built in {time.perf_counter() - t0:.1f} s; aligning every network to it")
            t0 = time.perf_counter()
            meta = {k: store.manifest[k] for k in ("kind", "architecture", "targets", "source") if k in store.manifest}
            meta["generation"] = {"derived_from": str(store.root), "transform": "weight matching to a MergeMany reference",
                                  "alignment": {**settings, "reference": self.reference[0].tolist()}}
            write_mapped_store(store, root, self.align, metadata=meta, overwrite=True, desc="aligning")
            log(f"mlp-align: {store.num_networks} networks aligned in {time.perf_counter() - t0:.1f} s")
            aligned = WeightStore(root)
        self.align_in_forward = False
        return aligned

    def reference_networks(self, store: WeightStore, generator: torch.Generator) -> np.ndarray:
        """The store indices MergeMany builds the reference from: ``subsample`` usable train networks
        drawn as :func:`merge_many` draws them (so the result equals ``prepare`` on the whole split),
        without reading the split into memory."""
        start, stop = store.split_range("train")
        usable = np.flatnonzero(usable_mask(store, start, stop)) + start  # diverged ones would drag it away
        pick = subsample_indices(len(usable), self.merge_kw["subsample"], generator)
        return usable if pick is None else usable[pick.numpy()]

    def input_transform(self) -> Callable[[WeightSpace], WeightSpace]:
        """Alignment to the trained reference, for networks of any store; ``forward`` no longer aligns."""
        if not self.prepared:
            raise ValueError("this mlp-align model holds no alignment reference (checkpoints written before the "
                             "reference was saved with the model cannot align new networks); train it again")
        self.align_in_forward = False
        return self.align


def _open_if_made_with(root: Path, settings: dict) -> WeightStore | None:
    """The aligned store at ``root`` if it is complete and was made from the same store with ``settings``."""
    try:
        aligned = WeightStore(root)
    except StoreError:  # none yet, or an interrupted or damaged one: make it again
        return None
    made = aligned.manifest.get("generation", {}).get("alignment") or {}
    return aligned if all(made.get(k) == v for k, v in settings.items()) and "reference" in made else None
