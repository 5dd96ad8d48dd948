"""The images a classifier zoo's networks classify, and the corrupted domain they are adapted to.

A classifier store records how its networks were made (``generation.dataset``, the files read and
their checksums, ``architecture.input``); :func:`store_images` reads the same images again and
refuses others. The **target domain** is those images corrupted with kornia, in this order: a
random rotation, a random horizontal flip, colour jitter, Gaussian noise, then clipped to [0, 1]
(:class:`Corruption`; the paper names the four, not their strengths).

Image splits (:class:`Domain`): adaptation trains on the source's train split (the official train
images minus the source's validation hold-out, e.g. CIFAR-10's last 10%), corrupted afresh at every
step; model selection uses the hold-out, and the test metrics the official test images, each
corrupted once with a fixed seed (:data:`FIXED_SEED`): the same images for every method and run.
The networks themselves were trained on the clean official train split, hold-out included.

A training step (:meth:`Domain.training_images`) draws ``per_class`` images of every class that a
network of the batch learns, corrupts them in one kornia call, and hands each network the images of
its own classes (``per_class`` of each, so a binary classifier's batch is balanced) with the label's
position among its classes as the target.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from zoo.sources import DataError, get_source
from zoo.store import StoreError, WeightStore
from zoo.train.data import ClassifierData, classifier_data, normalized

Tensor = torch.Tensor
FIXED_SEED = 0  # the fixed corruption of the validation and test images
FIXED_CHUNK = 2000  # images corrupted per kornia call for the fixed sets (the draws depend on it)


@dataclass(frozen=True)
class Corruption:
    """How clean images in [0, 1] become the target domain (kornia, p = 1 for every step but the flip).

    The paper names the corruptions, not their strengths. These cost binary CIFAR-10 classifiers
    about 14 points (docs/train.md); the rotation does most of it, while noise of this size alone
    costs nothing measurable (an MLP's first layer averages it out).
    """

    degrees: float = 45.0  # rotation angle ~ U(-degrees, degrees), zero padding
    flip: float = 0.5  # probability of a horizontal flip
    brightness: float = 0.5  # ColorJitter factors ~ U(1 - s, 1 + s) (hue: shift ~ U(-h, h))
    contrast: float = 0.5
    saturation: float = 0.5
    hue: float = 0.0  # kornia's hue shift goes through HSV: 7x the rest of the corruption's time
    noise: float = 0.2  # std of the additive Gaussian noise, in units of the [0, 1] pixel range

    def module(self, channels: int) -> torch.nn.Module:
        import kornia.augmentation as K

        colour = dict(saturation=self.saturation, hue=self.hue) if channels == 3 else {}
        return torch.nn.Sequential(
            K.RandomRotation(degrees=self.degrees, p=1.0),
            K.RandomHorizontalFlip(p=self.flip),
            K.ColorJitter(brightness=self.brightness, contrast=self.contrast, p=1.0, **colour),
            K.RandomGaussianNoise(mean=0.0, std=self.noise, p=1.0),
        )

    def describe(self) -> dict:
        import kornia

        return {**asdict(self), "order": "rotation, horizontal flip, colour jitter, Gaussian noise, clip to [0, 1]",
                "library": f"kornia {kornia.__version__}", "fixed_seed": FIXED_SEED}


def _recorded_root(manifest: dict) -> str | None:
    """The folder of the files the store's images were read from, if it is still there."""
    files = manifest.get("source", {}).get("files") or []
    folders = {str(Path(f["path"]).parent) for f in files if f.get("path")}
    return next((f for f in sorted(folders) if Path(f).is_dir()), None)


def store_images(store: WeightStore, data_root: str | None = None):
    """``(source, ClassifierData)``: the images ``store``'s classifiers were trained and tested on,
    read from ``data_root`` (default: the folder the store recorded, else ``$ZOO_DATA_ROOT``)."""
    manifest = store.manifest
    arch, generation = manifest.get("architecture", {}), manifest.get("generation", {})
    if arch.get("family") != "mlp-classifier":
        raise StoreError(f"{store.root} holds {manifest.get('kind', 'unknown')} networks, not image classifiers; "
                         f"adaptation needs a classifier zoo (e.g. `zoo generate cifar10-classifiers`)")
    if "dataset" not in generation or "input" not in arch:
        raise StoreError(f"{store.root} records no data set or input normalization (an imported zoo): adaptation "
                         f"needs the images its classifiers were trained on; use the zoo `zoo generate` made")
    root = data_root or _recorded_root(manifest)
    source = get_source(generation["dataset"], root, **(generation.get("source_options") or {}))
    data = classifier_data(source, arch["input"]["mean"], arch["input"]["std"])
    recorded = {f["name"]: f.get("sha256") for f in manifest.get("source", {}).get("files", [])}
    for record in source.files_read():
        expected = recorded.get(record.get("name"))
        if expected is not None and record.get("sha256") != expected:
            raise DataError(f"{record.get('path', record.get('name'))} is not the file the classifiers of {store.root} "
                            f"were trained with (sha256 {record.get('sha256')}, the store recorded {expected}); "
                            f"pass --data-root with the store's images")
    if list(data.image_shape) != list(arch["input"]["image_shape"]):
        raise DataError(f"{source.name} images are {data.image_shape}, the store's networks take "
                        f"{arch['input']['image_shape']}")
    return source, data


class Domain:
    """A classifier store's images: clean source images and the corrupted target domain."""

    def __init__(self, data: ClassifierData, holdout: np.ndarray, corruption: Corruption = Corruption()):
        h, w, c = data.image_shape
        self.data, self.corruption = data, corruption
        self.shape = (c, h, w)  # the input vector is the channel planes, each row-major
        self.mean = torch.tensor(data.mean, dtype=torch.float32).view(c, 1, 1)
        self.std = torch.tensor(data.std, dtype=torch.float32).view(c, 1, 1)
        self.augment = corruption.module(c)
        train = torch.from_numpy(data.train_pixels).view(-1, c, h, w)
        labels = torch.from_numpy(data.train_labels)
        keep = torch.from_numpy(~holdout)
        self.train_pixels, self.train_labels = train[keep], labels[keep]
        self.pools = {int(k): (self.train_labels == k).nonzero().squeeze(1) for k in self.train_labels.unique()}
        self.heldout_pixels, self.heldout_labels = train[~keep], labels[~keep]
        self._fixed: dict[str, tuple[Tensor, Tensor]] = {}

    @classmethod
    def of_store(cls, store: WeightStore, data_root: str | None = None, corruption: Corruption = Corruption()):
        source, data = store_images(store, data_root)
        return cls(data, source.holdout.mask(len(data.train_labels)), corruption)

    def inputs(self, images: Tensor) -> Tensor:
        """Images ``[N, C, H, W]`` in [0, 1] -> the networks' input vectors ``[N, C*H*W]``
        (``architecture.input``: ``(value - mean[c]) / std[c]``, float32)."""
        return ((images - self.mean) / self.std).flatten(1)

    def corrupt(self, pixels: Tensor) -> Tensor:
        """uint8 images ``[N, C, H, W]`` -> corrupted input vectors (torch's global random state)."""
        images = pixels.to(torch.float32) / np.float32(self.data.pixel_scale)
        return self.inputs(self.augment(images).clamp_(0.0, 1.0))

    def training_images(self, classes: Tensor, per_class: int) -> tuple[Tensor, Tensor]:
        """Inputs ``[K, c * per_class, d_0]`` and targets ``[K, c * per_class]`` (the position of each
        image's label in its network's ``classes`` ``[K, c]``), freshly drawn and corrupted."""
        present = classes.unique().tolist()
        missing = [k for k in present if k not in self.pools]
        if missing:
            raise DataError(f"no training image of class(es) {missing} to adapt the networks with")
        drawn = torch.cat([self.pools[k][torch.randint(len(self.pools[k]), (per_class,))] for k in present])
        x = self.corrupt(self.train_pixels[drawn])
        block = {k: i * per_class for i, k in enumerate(present)}  # where class k's images start in x
        offset = torch.arange(per_class)
        rows = torch.stack([torch.cat([block[k] + offset for k in row]) for row in classes.tolist()])
        targets = torch.arange(classes.shape[1]).repeat_interleave(per_class).expand(len(classes), -1)
        return x[rows], targets

    def fixed_images(self, which: str) -> tuple[Tensor, Tensor]:
        """``(inputs [N, d_0], labels [N])`` of a fixed image set: ``"val"`` (the hold-out, corrupted),
        ``"test"`` (the official test images, corrupted) or ``"clean-test"`` (as the store's
        ``test_accuracy`` counts them). Corrupted once per process with :data:`FIXED_SEED`."""
        if which not in self._fixed:
            if which == "clean-test":
                self._fixed[which] = (normalized(self.data, "test"), torch.from_numpy(self.data.test_labels))
            elif which in ("val", "test"):
                pixels, labels = ((self.heldout_pixels, self.heldout_labels) if which == "val" else
                                  (torch.from_numpy(self.data.test_pixels).view(-1, *self.shape),
                                   torch.from_numpy(self.data.test_labels)))
                if len(labels) == 0:
                    raise DataError(f"no {which} images to evaluate the adapted networks on")
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(FIXED_SEED)
                    x = torch.cat([self.corrupt(pixels[i : i + FIXED_CHUNK]) for i in range(0, len(pixels), FIXED_CHUNK)])
                self._fixed[which] = (x, labels)
            else:
                raise ValueError(f"unknown image set {which!r}: val, test or clean-test")
        return self._fixed[which]
