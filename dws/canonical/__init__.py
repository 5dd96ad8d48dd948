"""Canonical forms of networks under their symmetries, as store transforms (``zoo derive --canonicalize``).

``sign`` (:mod:`.sign`: odd activations' sign flips), ``sort`` (:mod:`.sort`: a fixed order of hidden
neurons), ``align`` (:mod:`.reference`: weight matching to mlp-align's MergeMany reference), and the
derived store they are written into (:mod:`.store`).
"""

from .sign import ODD_ACTIVATIONS, canonical_flips, canonical_signs, flip_signs
from .sort import canonical_order, canonical_perms, neuron_order
from .store import TRANSFORMS, canonicalizer, derive_canonical_store, parse_transforms

__all__ = ["ODD_ACTIVATIONS", "TRANSFORMS", "canonical_flips", "canonical_order", "canonical_perms",
           "canonical_signs", "canonicalizer", "derive_canonical_store", "flip_signs", "neuron_order",
           "parse_transforms"]
