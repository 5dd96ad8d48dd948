"""Neural functionals (NFNs) of Zhou et al., "Permutation Equivariant Neural Functionals" (NeurIPS 2023).

A room of its own beside :mod:`dws.nn` (one idea per module, see ``docs/dws.md``, "NFN-NP and NFN-HNP"):

* :mod:`dws.nfn.neurons`: the per-neuron and global summaries every NF layer is built from
  (:mod:`dws.nfn.init`: their shared-fan-in initialization);
* :mod:`dws.nfn.np_layer`: the NP layer (equivariant to permutations of *all* neurons);
* :mod:`dws.nfn.hnp_layer`: the HNP layer (hidden neurons only; more terms at the first and last layers);
* :mod:`dws.nfn.encoding`: Fourier features of the weight values, NP's input/output position encoding;
* :mod:`dws.nfn.norm`: layer norms that keep the symmetry (options; the code's MNIST models have none);
* :mod:`dws.nfn.dropout`: channel dropout after every NF layer (the code's ``feature_dropout``);
* :mod:`dws.nfn.pooling`: the invariant pooling (HNPPool) and the MLP head;
* :mod:`dws.nfn.models`: ``NFNInvariant`` (``nfn-np``, ``nfn-hnp``).

Tensors use the project's convention (:mod:`dws.weightspace`): ``W_l`` is ``[B, d_l, d_{l-1}, C]``,
``b_l`` is ``[B, d_l, C]``, channels last.
"""

from dws.nfn.dropout import ChannelDropout
from dws.nfn.encoding import FourierFeatures, IOPositionEncoding
from dws.nfn.hnp_layer import HNPLayer
from dws.nfn.models import NFN_MODES, NFNInvariant
from dws.nfn.norm import NFN_NORMS, ChannelLayerNorm, NeuronLayerNorm
from dws.nfn.np_layer import NPLayer
from dws.nfn.pooling import HNPPool, MLPHead

__all__ = ["FourierFeatures", "IOPositionEncoding", "HNPLayer", "NPLayer", "HNPPool", "MLPHead",
           "NFNInvariant", "NFN_MODES", "ChannelDropout", "ChannelLayerNorm", "NeuronLayerNorm", "NFN_NORMS"]
