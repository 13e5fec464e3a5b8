"""What the studies' training runs share: a quiet CPU Trainer, generated data, slowdowns, emulated compute in an MLP,
step and epoch timers, a start barrier and a child's command-line flags.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from benchmarks.harness.launch import scenario_command
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


def fit(
    trainer: L.Trainer, model: L.LightningModule, train: TensorDataset, val: TensorDataset, batch_size: int
) -> None:
    """``trainer.fit`` on shuffled training batches of ``batch_size`` and validation batches of 1024."""
    trainer.fit(model, DataLoader(train, batch_size=batch_size, shuffle=True), DataLoader(val, batch_size=1024))


def chosen(text: str, known: Sequence[str]) -> list[str]:
    """The comma-separated configurations named in ``text``; an unknown one exits, naming the known ones."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if unknown := sorted(set(names) - set(known)):
        raise SystemExit(f"error: unknown configs {unknown}; choose from {', '.join(known)}")
    return names


def add_study_flags(
    parser: argparse.ArgumentParser,
    configs: Sequence[str],
    default_configs: str,
    workers: str,
    hl: str,
    budget_s: float,
) -> None:
    """The flags of a study over workers x heterogeneity level x seed (the cells, the task, the recipe, the slowdown),
    and the hidden ones with which it runs a cell in a child: ``--run CONFIG`` on ``--n`` ranks at ``--level``."""
    parser.add_argument("--workers", default=workers)
    parser.add_argument("--hl", default=hl)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--configs", default=default_configs)
    parser.add_argument("--budget-s", type=float, default=budget_s, help="start no new cell after this many seconds")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--noise", type=float, default=4.0)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--throttle", choices=("sleep", "cfs"), default="sleep", help="slow ranks by sleeps or a quota")
    parser.add_argument("--run", choices=configs, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--level", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)


def child_command(scenario: str, args: argparse.Namespace, keys: Sequence[str], **cell: Any) -> list[str]:
    """The command that runs one ``cell`` of ``scenario`` in a child, given the study's settings ``keys``."""
    return scenario_command(scenario, *flags(**cell, **{key: getattr(args, key) for key in keys}))


def finish(trainer: L.Trainer, path: str | Path, result: Any, every_rank: bool = False) -> None:
    """Writes ``result`` as JSON to ``path`` on rank 0 (or on ``every_rank``), then leaves the process group: a gloo
    group left alive can abort the interpreter at exit."""
    if every_rank or trainer.is_global_zero:
        Path(path).write_text(json.dumps(result, default=str))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def slowdown_factors(workers: int, hl: float) -> list[float]:
    """Per-rank slowdowns from 1 (rank 0) to ``hl`` (the last rank), geometrically spaced."""
    if workers == 1:
        return [1.0]
    return [hl ** (rank / (workers - 1)) for rank in range(workers)]


def flags(**values: Any) -> list[str]:
    """A child's command-line words for ``values`` (``cost_s`` -> ``--cost-s``; ``True``: the bare flag; ``False``
    and ``None``: nothing).

    Example::

        >>> flags(cost_s=0.5, breakdown=True, quick=False, out=None)
        ['--cost-s', '0.5', '--breakdown']
    """
    words: list[str] = []
    for key, value in values.items():
        if value is not None and value is not False:
            words += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return words


def spend(seconds: float, compute: str = "sleep") -> None:
    """Emulated compute: sleep ``seconds`` (no CPU used: ranks do not compete for the host's cores), or with
    ``compute="spin"`` spend them on the process's CPU clock in a busy loop (ranks compete as real compute does,
    and a CPU quota throttles it)."""
    if compute == "sleep":
        time.sleep(seconds)
        return
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


class MLP(L.LightningModule):
    """A perceptron ``features -> hidden... -> classes``, SGD with momentum, ``val_acc`` logged across ranks; a step
    spends ``overhead_s + cost_s x samples`` (:func:`spend`), and ``emulated_cpu_s`` sums the sleeps so that a CPU
    quota can charge them (:meth:`cpu_clock`). ``log_loss``: log ``train_loss`` every step, as ``MLPClassifier``."""

    def __init__(
        self,
        features: int,
        classes: int,
        hidden: Sequence[int],
        lr: float,
        momentum: float,
        cost_s: float = 0.0,
        activation: type[nn.Module] = nn.ReLU,
        overhead_s: float = 0.0,
        compute: str = "sleep",
        log_loss: bool = False,
    ) -> None:
        super().__init__()
        self.lr, self.momentum, self.cost_s, self.overhead_s, self.compute = lr, momentum, cost_s, overhead_s, compute
        self.log_loss = log_loss
        layers: list[nn.Module] = []
        width = features
        for size in hidden:
            layers += [nn.Linear(width, size), activation()]
            width = size
        self.net = nn.Sequential(*layers, nn.Linear(width, classes))
        self.emulated_cpu_s = 0.0

    def step_cost_s(self, samples: int) -> float:
        """The emulated compute of a training step on ``samples`` samples."""
        return self.overhead_s + self.cost_s * samples

    def cpu_clock(self) -> float:
        """The process's CPU time plus the emulated sleeps (``SlowdownEmulator``'s ``cpu_clock`` for a quota)."""
        return time.process_time() + self.emulated_cpu_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        seconds = self.step_cost_s(x.shape[0])
        if seconds > 0:
            spend(seconds, self.compute)
            self.emulated_cpu_s += seconds if self.compute == "sleep" else 0.0
        loss = nn.functional.cross_entropy(self(x), y)
        if self.log_loss:
            self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_acc", (self(x).argmax(-1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)


class TrainingTimes(Callback):
    """Per epoch: the mode, training seconds (validation excluded), validation accuracy and :meth:`extra`;
    ``start_together``: a barrier when training starts (ASP has no collective before its first step)."""

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


class StepClock(Callback):
    """A rank's clock per training step: its start and end (``perf_counter``) and its local batch size."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.local_sizes: list[int] = []

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.starts.append(time.perf_counter())
        self.local_sizes.append(int(batch[0].shape[0]))

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self.ends.append(time.perf_counter())

    def gather_sizes(self, trainer: L.Trainer) -> list[list[int]]:
        """Every rank's local batch sizes, step by step (an all-gather: every rank calls it)."""
        if trainer.world_size == 1:
            return [self.local_sizes]
        gathered: list[Any] = [None] * trainer.world_size
        torch.distributed.all_gather_object(gathered, self.local_sizes)
        return gathered


class StartTogether(Callback):
    """``jobs`` jobs run side by side meet in ``folder`` before training, so that no job's measured epochs overlap
    another's start-up (imports take seconds of CPU)."""

    def __init__(self, folder: str | Path, jobs: int) -> None:
        self.folder, self.jobs = Path(folder), jobs

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        (self.folder / f"ready-{os.getpid()}").touch()
        while len(list(self.folder.glob("ready-*"))) < self.jobs:
            time.sleep(0.01)
