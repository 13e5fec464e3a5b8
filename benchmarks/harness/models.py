"""What the studies' training runs share: a quiet CPU Trainer, a train/validation split of the generated data, a
perceptron with optional emulated compute, and a per-epoch recorder of training times."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import TensorDataset
from typing_extensions import override

from lightning_hetero.synthetic import make_classification


def quiet_trainer(**kwargs: Any) -> L.Trainer:
    """A CPU ``Trainer`` with no logger, checkpoints, progress bar or model summary; ``kwargs`` add to or override
    those settings (``devices``, ``strategy``, ``max_epochs``, ``callbacks``, ...)."""
    settings: dict[str, Any] = {
        "accelerator": "cpu",
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    return L.Trainer(**(settings | kwargs))


def classification_split(
    samples: int, val_samples: int, seed: int, noise: float, features: int = 32, classes: int = 4
) -> tuple[TensorDataset, TensorDataset]:
    """``samples`` training and ``val_samples`` validation samples of one :func:`make_classification` draw."""
    x, y = make_classification(samples + val_samples, features, classes, seed=seed, noise=noise).tensors
    return TensorDataset(x[:samples], y[:samples]), TensorDataset(x[samples:], y[samples:])


class MLP(L.LightningModule):
    """A perceptron ``features -> hidden... -> classes``, SGD with momentum, ``val_acc`` logged across ranks.

    Args:
        features: input width.
        classes: number of classes.
        hidden: the hidden layers' widths.
        lr: SGD learning rate.
        momentum: SGD momentum.
        cost_s: emulated compute: each training step also sleeps this many seconds per sample (summed in
            ``slept_s``).
        activation: the hidden layers' activation.
    """

    def __init__(
        self,
        features: int,
        classes: int,
        hidden: Sequence[int],
        lr: float,
        momentum: float,
        cost_s: float = 0.0,
        activation: type[nn.Module] = nn.ReLU,
    ) -> None:
        super().__init__()
        self.lr, self.momentum, self.cost_s = lr, momentum, cost_s
        layers: list[nn.Module] = []
        width = features
        for size in hidden:
            layers += [nn.Linear(width, size), activation()]
            width = size
        self.net = nn.Sequential(*layers, nn.Linear(width, classes))
        self.slept_s = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.cost_s > 0:
            started = time.perf_counter()
            time.sleep(self.cost_s * x.shape[0])
            self.slept_s += time.perf_counter() - started
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_acc", (self(x).argmax(-1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)


class TrainingTimes(Callback):
    """Per epoch: the mode, training seconds (validation excluded) and validation accuracy, plus what
    :meth:`extra` adds.

    Args:
        start_together: a barrier when training starts (ASP has no collective before its first step).
    """

    def __init__(self, start_together: bool = False) -> None:
        self.start_together = start_together
        self.epochs: list[dict[str, Any]] = []
        self._start = self._val_s = self._val_start = 0.0
        self._mode = ""

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.start_together:
            trainer.strategy.barrier()

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start, self._val_s, self._mode = time.perf_counter(), 0.0, trainer.strategy.mode

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._val_start = time.perf_counter()

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._val_s += time.perf_counter() - self._val_start

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        train_s = time.perf_counter() - self._start - self._val_s
        metric = trainer.callback_metrics.get("val_acc")
        record = {"epoch": trainer.current_epoch, "mode": self._mode, "train_s": train_s}
        record["val_acc"] = None if metric is None else float(metric)
        self.epochs.append(record | self.extra(trainer, self._mode))

    def extra(self, trainer: L.Trainer, mode: str) -> dict[str, Any]:
        """More fields for this epoch's record (none here)."""
        return {}
