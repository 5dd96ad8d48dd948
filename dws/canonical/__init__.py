"""Canonical forms of networks under their symmetries, as store transforms (``zoo derive --canonicalize``).

``sign`` (:mod:`.sign`: odd activations' sign flips), ``scale`` (:mod:`.scale`: ReLU's positive scalings),
``sort`` (:mod:`.sort`: a fixed order of hidden neurons), ``align`` (:mod:`.reference`: weight matching to
mlp-align's MergeMany reference), and the derived store they are written into (:mod:`.store`).
"""

from .scale import HOMOGENEOUS_ACTIVATIONS, canonical_neuron_scales, canonical_scales
from .sign import ODD_ACTIVATIONS, canonical_flips, canonical_signs, flip_signs
from .sort import canonical_order, canonical_perms, neuron_order
from .store import TRANSFORMS, canonicalizer, derive_canonical_store, parse_transforms

__all__ = ["HOMOGENEOUS_ACTIVATIONS", "ODD_ACTIVATIONS", "TRANSFORMS", "canonical_flips", "canonical_neuron_scales",
           "canonical_order", "canonical_perms", "canonical_scales", "canonical_signs", "canonicalizer",
           "derive_canonical_store", "flip_signs", "neuron_order", "parse_transforms"]
