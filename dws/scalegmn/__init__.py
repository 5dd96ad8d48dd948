"""ScaleGMN of Kalogeropoulos et al., "Scale Equivariant Graph Metanetworks" (NeurIPS 2024).

A room of its own beside :mod:`dws.nn` and :mod:`dws.nfn` (one idea per module; docs/dws.md,
"scalegmn and scalegmn-b"):

* :mod:`dws.scalegmn.symmetry`: an activation's scaling symmetry (sign or positive scale) and the
  invariant maps that forget it (symmetrization ``rho(x) + rho(-x)``, normalization ``x / |x|``);
* :mod:`dws.scalegmn.linear`: how the linear maps of edge features are computed (1x1 convolutions,
  initial edges as a weight times a vector);
* :mod:`dws.scalegmn.mlp`: the reference code's MLP;
* :mod:`dws.scalegmn.equivariant`: scale-equivariant node and edge functions ``W x * g(inv(x))``;
* :mod:`dws.scalegmn.graph`: weight spaces as dense per-layer neuron graphs, positional embeddings;
* :mod:`dws.scalegmn.layers`: one message-passing layer, forward or bidirectional;
* :mod:`dws.scalegmn.models`: ``ScaleGMNInvariant`` (``scalegmn``, ``scalegmn-b``).

Plain dense PyTorch per layer pair (no graph library): ``edges[l]`` is ``[B, n_{l+1}, n_l, d]``.
"""

from dws.scalegmn.models import PAPER_HIDDEN, PAPER_LAYERS, VARIANTS, ScaleGMNInvariant
from dws.scalegmn.symmetry import SYMMETRY_OF_ACTIVATION, symmetry_of

__all__ = ["ScaleGMNInvariant", "VARIANTS", "PAPER_HIDDEN", "PAPER_LAYERS", "SYMMETRY_OF_ACTIVATION", "symmetry_of"]
