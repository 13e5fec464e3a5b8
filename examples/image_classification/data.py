"""CIFAR-10 from disk through torchvision, or generated CIFAR-shaped data; nothing is ever downloaded.

Example::

    >>> dm = CIFAR10DataModule(num_samples=64, num_val_samples=16, batch_size=8)
    >>> dm.setup("fit")
    >>> x, y = next(iter(dm.train_dataloader()))
    >>> tuple(x.shape), tuple(y.shape)
    ((8, 3, 32, 32), (8,))
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def make_cifar_like(
    num_samples: int, num_classes: int = 10, seed: int = 0, noise: float = 6.0
) -> tuple[TensorDataset, torch.Tensor]:
    """Generated 3x32x32 images: one smooth random template per class plus per-pixel Gaussian noise.

    The templates are 4x4 random patterns upsampled to 32x32, so a convolutional network learns them quickly while
    single noisy pixels say little. Returns the dataset and the templates (``num_classes x 3 x 32 x 32``).

    Example::

        >>> dataset, templates = make_cifar_like(5)
        >>> tuple(dataset[0][0].shape), tuple(templates.shape)
        ((3, 32, 32), (10, 3, 32, 32))
    """
    if num_samples <= 0:
        raise ValueError(f"num_samples must be positive, got {num_samples}")
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.randn(num_classes, 3, 4, 4, generator=generator)
    templates = F.interpolate(coarse, size=32, mode="bilinear", align_corners=False)
    labels = torch.randint(num_classes, (num_samples,), generator=generator)
    images = templates[labels] + noise * torch.randn(num_samples, 3, 32, 32, generator=generator)
    return TensorDataset(images, labels), templates


def cifar10_transforms(train: bool, augment: bool) -> Callable[[Any], torch.Tensor]:
    """The usual CIFAR-10 preprocessing: random crop with 4-pixel padding and flips (training only), normalisation."""
    from torchvision import transforms

    steps = [transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip()] if train and augment else []
    return transforms.Compose([*steps, transforms.ToTensor(), transforms.Normalize(CIFAR10_MEAN, CIFAR10_STD)])


class CIFAR10DataModule(L.LightningDataModule):
    """CIFAR-10 when ``data_dir`` is given, generated CIFAR-shaped data (10 classes) when it is not.

    Args:
        data_dir: a folder holding torchvision's ``cifar-10-batches-py``; needs the ``[vision]`` extra. ``None``
            trains on generated data. The data is never downloaded here: fetch it once beforehand.
        batch_size: the per-rank batch size of the train loader (HeteroBatchCallback's starting size).
        num_workers: DataLoader worker processes.
        augment: random crops and flips on the CIFAR-10 training set.
        num_samples: generated training samples (generated data only).
        num_val_samples: generated validation samples (generated data only).
        noise: standard deviation of the generated images' pixel noise.
        seed: seeds the generated data.
    """

    num_classes = 10

    def __init__(
        self,
        data_dir: str | None = None,
        batch_size: int = 128,
        num_workers: int = 0,
        augment: bool = True,
        num_samples: int = 5000,
        num_val_samples: int = 1000,
        noise: float = 6.0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if data_dir is not None and not (Path(data_dir) / CIFAR10_FOLDER).is_dir():
            raise FileNotFoundError(
                f"data_dir={data_dir!r} has no {CIFAR10_FOLDER} folder. This example never downloads; fetch CIFAR-10 "
                f"once with: python -c \"import torchvision; torchvision.datasets.CIFAR10('{data_dir}', download=True)\""
                ", or leave data_dir unset to train on generated data."
            )
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.data_dir = data_dir
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.augment = augment
        self.num_samples = num_samples
        self.num_val_samples = num_val_samples
        self.noise = noise
        self.seed = seed
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None

    def setup(self, stage: str) -> None:
        if self.train_set is not None:
            return
        if self.data_dir is None:
            dataset, _ = make_cifar_like(
                self.num_samples + self.num_val_samples, self.num_classes, self.seed, self.noise
            )
            images, labels = dataset.tensors
            self.train_set = TensorDataset(images[: self.num_samples], labels[: self.num_samples])
            self.val_set = TensorDataset(images[self.num_samples :], labels[self.num_samples :])
        else:
            from torchvision.datasets import CIFAR10

            self.train_set = CIFAR10(
                self.data_dir, train=True, download=False, transform=cifar10_transforms(True, self.augment)
            )
            self.val_set = CIFAR10(
                self.data_dir, train=False, download=False, transform=cifar10_transforms(False, self.augment)
            )

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256, num_workers=self.num_workers)
