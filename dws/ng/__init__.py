"""Neural graphs of Kofinas et al., "Graph Neural Networks for Learning Equivariant Representations of
Neural Networks" (ICLR 2024; reference code mkofinas/neural-graphs).

A room of its own beside :mod:`dws.nn` and :mod:`dws.nfn` (one idea per module, see ``docs/dws.md``,
"ng-gnn and ng-transformer"):

* :mod:`dws.ng.graph`: ``LayeredGraph``, the network as a graph held as dense per-layer tensors;
* :mod:`dws.ng.positions`: learned positional features of input and output neurons;
* :mod:`dws.ng.construct`: weight space -> graph (Fourier features, projections, positions);
* :mod:`dws.ng.aggregation`: PNA's aggregators and degree scalers;
* :mod:`dws.ng.pna`: PNA message passing with edge updates (``ng-gnn``'s backbone);
* :mod:`dws.ng.relational`: the relational transformer (``ng-transformer``'s backbone);
* :mod:`dws.ng.readout`: the output neurons' features -> MLP head;
* :mod:`dws.ng.models`: ``NGGNN`` and ``NGTransformer``.
"""

from dws.ng.construct import GraphConstructor
from dws.ng.graph import LayeredGraph
from dws.ng.models import PAPER_NG_WIDTH, NGGNN, NGTransformer, gnn_ratios, transformer_ratios

__all__ = ["PAPER_NG_WIDTH", "GraphConstructor", "LayeredGraph", "NGGNN", "NGTransformer", "gnn_ratios",
           "transformer_ratios"]
