"""``zoo derive STORE --canonicalize T[,T...] --out NEW``: a store whose networks are canonicalized.

Every network of every split goes through the transforms in the order given (``sign``, ``scale``,
``sort``, ``align``; see their modules), one store chunk at a time, into an ordinary complete store (fresh
statistics, content ID, card) with the same rows and splits. Its manifest keeps the source's
description of the networks (kind, architecture, generation, source, targets, ...) and adds
``derived_from`` (the source's location and content ID), ``canonicalize`` (the transforms, in
order), ``canonicalization`` (each one's rule; for ``align`` its settings and reference) and
``command`` (the ``zoo derive`` line that makes it again); the card's description says the same. A local store is written beside ``NEW`` and moved there only
when complete, so an error leaves nothing (and ``--overwrite`` replaces an old store only then).
"""

from __future__ import annotations

from typing import Callable

from dws.stream.mapped import write_mapped_store
from dws.weightspace import WeightSpace
from zoo.store import StoreError, WeightStore
from zoo.store.format import MANIFEST
from zoo.store.identity import KEY as ID_KEY
from zoo.store.staging import staged_folder
from zoo.store.location import UrlRoot, is_empty, remove_tree, store_root

from .reference import reference_alignment
from .scale import HOMOGENEOUS_ACTIVATIONS, canonical_scales
from .sign import ODD_ACTIVATIONS, canonical_signs
from .sort import canonical_order

TRANSFORMS = ("sign", "scale", "sort", "align")
RULES = {
    "sign": "each hidden neuron flipped (incoming weights, bias and outgoing weights negated) where its key is "
            "negative; key: the bias, or the sum of its incoming weights where the bias is 0; layers first to last",
    "scale": "each hidden neuron's incoming weights and bias multiplied, and its outgoing weights divided, by one "
             "positive number so that its incoming weights and bias have Euclidean norm 1 (all-zero ones, and norms "
             "within 1e-5 of 1, left as they are); layers first to last",
    "sort": "each hidden layer's neurons in ascending order of the bias, ties broken by the incoming weights "
            "compared entry by entry; layers first to last, stable",
    "align": "weight matching to one MergeMany reference built from the train split, as zoo train --model "
             "mlp-align builds it (same seed: the same networks)",
}
#: manifest keys the writer makes for the new store (``command``: the ``zoo derive`` line that remakes it,
#: which ``zoo verify`` prints as the repair); every other key of the source's is kept
WRITTEN_KEYS = ("format", "format_version", "created", "status", "arrays", "num_networks", "chunk_size",
                "num_chunks", "complete_chunks", "parameters", "splits", "checksums", "checksum", "software", "machine",
                "normalization", ID_KEY, "completed", "command")


def parse_transforms(text: str) -> tuple[str, ...]:
    """``"sign,sort"`` -> ``("sign", "sort")``; ValueError for an unknown, repeated or missing name."""
    names = tuple(part.strip() for part in text.split(","))
    unknown = [n for n in names if n not in TRANSFORMS]
    if unknown or not names:
        raise ValueError(f"--canonicalize {text!r}: unknown transform {', '.join(map(repr, unknown)) or '(none)'}; "
                         f"choose from {', '.join(TRANSFORMS)} (several comma-separated, applied in order)")
    if len(set(names)) != len(names):
        raise ValueError(f"--canonicalize {text!r} names a transform twice; each is applied at most once")
    return names


def derive_canonical_store(source, out, transforms: tuple[str, ...], *, overwrite: bool = False, seed: int = 0,
                           log=print) -> dict:
    """Write ``out`` from the store at ``source`` (see the module); returns a summary for the command line."""
    store = WeightStore(source)
    root = store_root(out)
    if str(root.resolve()) == str(store.root.resolve()):
        raise ValueError(f"--out {out} is the source store; choose another folder")
    _check_out(root, overwrite)
    for name in transforms:
        if name in NEEDS:
            require_activation(store, name)
    transform, record = canonicalizer(store, transforms, seed, log)
    manifest = store.manifest
    origin = {"store": str(store.root.resolve()), "content_id": manifest.get(ID_KEY)}
    meta = {k: v for k, v in manifest.items() if k not in WRITTEN_KEYS}
    meta["description"] = (f"{manifest.get('description') or manifest.get('kind', 'networks')}; canonicalized "
                           f"({' then '.join(transforms)}) by `zoo derive` from the store "
                           f"{origin['content_id'] or origin['store']}")
    meta.update(derived_from=origin, canonicalize=list(transforms), canonicalization=record,
                command=["zoo", "derive", origin["store"], "--canonicalize", ",".join(transforms), "--out", str(root),
                         *(["--seed", str(seed)] if "align" in transforms and seed else []), "--overwrite"])
    _write_whole(root, lambda target, replace: write_mapped_store(
        store, target, transform, metadata=meta, overwrite=replace, desc="canonicalizing"))
    derived = WeightStore(root)
    return {"store": str(root), "networks": derived.num_networks, "canonicalize": list(transforms),
            "content_id": derived.manifest.get(ID_KEY), "derived_from": origin}


def canonicalizer(store: WeightStore, transforms: tuple[str, ...], seed: int = 0, log=print,
                  ) -> tuple[Callable[[WeightSpace], WeightSpace], dict]:
    """``(transform, record)``: the transforms composed in order, and each one's rule (``align``: also its
    reference, built from the train split as the transforms before it leave it)."""
    steps: list[Callable[[WeightSpace], WeightSpace]] = []
    record: dict = {}
    for name in transforms:
        record[name] = {"rule": RULES[name]}
        if name == "sign":
            steps.append(canonical_signs)
        elif name == "scale":
            steps.append(canonical_scales)
        elif name == "sort":
            steps.append(canonical_order)
        else:
            log(f"align: building the MergeMany reference from the train split of {store.root}")
            align, settings = reference_alignment(store, seed, before=_chain(list(steps)))
            record[name].update(settings)
            steps.append(align)
    return _chain(steps), record


def _chain(steps: list[Callable[[WeightSpace], WeightSpace]]) -> Callable[[WeightSpace], WeightSpace]:
    def apply(ws: WeightSpace) -> WeightSpace:
        for step in steps:
            ws = step(ws)
        return ws
    return apply


def activations_of(store: WeightStore) -> set[str]:
    """The hidden activations of a store's networks: the manifest's, or (classifier zoos made with
    ``--diversity``) those its ``activation`` column names."""
    activation = (store.manifest.get("architecture") or {}).get("activation")
    if activation and activation.startswith("per network") and "activation" in store.networks.column_names:
        return set(store.networks.column("activation").to_pylist())
    return {activation or "unrecorded"}


#: the activations each symmetry transform needs, and what it does to a neuron that then keeps the function
NEEDS = {"sign": ("an odd activation", ODD_ACTIVATIONS, "flipping a neuron"),
         "scale": ("a positively homogeneous activation", HOMOGENEOUS_ACTIVATIONS, "scaling a neuron by s > 0")}


def require_activation(store: WeightStore, transform: str) -> None:
    """ValueError unless every network of ``store`` has an activation under which ``transform`` (``sign``,
    ``scale``) keeps its function."""
    kind, names, action = NEEDS[transform]
    found = activations_of(store)
    other = sorted(found - set(names))
    if other:
        fitting = [name for name, need in NEEDS.items() if found <= set(need[1])]
        raise ValueError(f"--canonicalize {transform} needs {kind} ({', '.join(names)}), where {action} keeps "
                         f"the function; {store.root} has {', '.join(other)} (use {', '.join(fitting + ['sort'])} "
                         f"or align)")


def _check_out(root, overwrite: bool) -> None:
    """Refuse an existing ``--out`` (without ``--overwrite``) and, even with it, anything but a store."""
    if is_empty(root):
        return
    if not (root / MANIFEST).exists():
        raise StoreError(f"--out {root} exists and is not a store; choose a new folder (nothing there is replaced)")
    if not overwrite:
        raise StoreError(f"--out {root} already holds a store; choose a new folder or pass --overwrite")


def _write_whole(root, write: Callable[[object, bool], object]) -> None:
    """``write(target, replace)`` so that ``root`` ends up holding the whole new store or what it held
    before (:func:`_check_out` has allowed replacing it). A local store is written in a hidden folder
    beside ``root`` and moved there when complete; a URL store (no rename) is written in place,
    replacing the old one first, and removed again on error."""
    if isinstance(root, UrlRoot):
        try:
            write(root, True)
        except BaseException:
            remove_tree(root)
            raise
        return
    with staged_folder(root) as stage:  # the old store (or an empty folder) goes only when the new one is whole
        write(stage, False)
