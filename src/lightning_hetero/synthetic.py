"""Generated data and a small model, so that examples, tests and benchmarks need no downloads.

Example::

    >>> import lightning as L
    >>> dm = SyntheticClassificationDataModule(num_samples=256, batch_size=32)
    >>> model = MLPClassifier(num_features=dm.num_features, num_classes=dm.num_classes)
    >>> trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False,
    ...                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    >>> trainer.fit(model, datamodule=dm)
    >>> trainer.global_step
    8
"""

from __future__ import annotations

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero._validation import check_range


def make_classification(
    num_samples: int, num_features: int = 32, num_classes: int = 4, seed: int = 0, noise: float = 0.5
) -> TensorDataset:
    """Gaussian clusters, one per class, around seeded random centres: learnable, but not in one step.

    Example::

        >>> ds = make_classification(10, num_features=3, num_classes=2)
        >>> x, y = ds[0]
        >>> tuple(x.shape), int(y) in (0, 1)
        ((3,), True)
    """
    check_range("num_samples", num_samples, low=1, integer=True)
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(num_classes, num_features, generator=generator) * 1.5
    labels = torch.randint(num_classes, (num_samples,), generator=generator)
    features = centres[labels] + noise * torch.randn(num_samples, num_features, generator=generator)
    return TensorDataset(features, labels)


class SyntheticClassificationDataModule(L.LightningDataModule):
    """Train and validation splits of :func:`make_classification`, with the same class centres.

    Args:
        num_samples: training samples; validation gets a quarter as many.
        batch_size: the per-rank batch size of the train loader.
        num_features: input width.
        num_classes: number of classes.
        seed: seeds the data.
        num_workers: DataLoader worker processes.
        shuffle: shuffle the training data each epoch.
        noise: the clusters' spread (see :func:`make_classification`; larger is harder).
    """

    def __init__(
        self,
        num_samples: int = 4096,
        batch_size: int = 32,
        num_features: int = 32,
        num_classes: int = 4,
        seed: int = 0,
        num_workers: int = 0,
        shuffle: bool = True,
        noise: float = 0.5,
    ) -> None:
        super().__init__()
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.num_features = num_features
        self.num_classes = num_classes
        self.seed = seed
        self.num_workers = num_workers
        self.shuffle = shuffle
        val_samples = max(1, num_samples // 4)
        data = make_classification(num_samples + val_samples, num_features, num_classes, seed=seed, noise=noise).tensors
        self.train_set = TensorDataset(data[0][:num_samples], data[1][:num_samples])
        self.val_set = TensorDataset(data[0][num_samples:], data[1][num_samples:])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train_set, batch_size=self.batch_size, shuffle=self.shuffle, num_workers=self.num_workers
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256, num_workers=self.num_workers)


class MLPClassifier(L.LightningModule):
    """A two-layer perceptron with cross-entropy loss, SGD and an accuracy metric; no batch norm.

    Args:
        num_features: input width.
        num_classes: number of classes.
        hidden: hidden width.
        lr: SGD learning rate.
        momentum: SGD momentum.
    """

    def __init__(
        self, num_features: int = 32, num_classes: int = 4, hidden: int = 64, lr: float = 0.1, momentum: float = 0.0
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(num_features, hidden), nn.Tanh(), nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(-1) == y).float().mean(), sync_dist=True, prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=self.hparams.momentum)
