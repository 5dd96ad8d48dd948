"""Tensor operations the weight-space models share, below the model families (:mod:`dws.nn`,
:mod:`dws.nfn`, :mod:`dws.ng`, :mod:`dws.scalegmn`), which do not import one another:

* :mod:`dws.ops.linear`: ``F.linear`` of large float32 CPU feature tensors as a 1x1 convolution
  (oneDNN's kernel through a public API), and ``Linear``, the ``nn.Linear`` that uses it.
"""
