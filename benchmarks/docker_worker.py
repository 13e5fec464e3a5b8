"""One rank of a docker scenario run inside a worker container: the CIFAR ResNet-20 under the container's quota (or
``--standalone``); writes ``OUT/report-rank{k}.json``. Copied into the containers alone: no ``benchmarks`` imports.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import HeteroBatchCallback, ProgressReporter
from lightning_hetero.measurement import cgroup_cpu_quota

CLASSES = 10


class ResNetClassifier(L.LightningModule):
    """The CIFAR ResNet-20 of ``examples/image_classification`` (BatchNorm included), SGD with momentum."""

    def __init__(self, lr: float, momentum: float) -> None:
        super().__init__()
        self.lr, self.momentum = lr, momentum
        try:
            from examples.image_classification.model import build_backbone
        except ImportError:  # in the worker image the examples sit in the working directory, not on sys.path
            sys.path.append(os.getcwd())
            from examples.image_classification.model import build_backbone
        self.net = build_backbone("resnet20")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_acc", (self(x).argmax(-1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)


def make_data(samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CIFAR-shaped images: one smooth random template per class plus noise (as examples' make_cifar_like)."""
    generator = torch.Generator().manual_seed(seed)
    templates = nn.functional.interpolate(torch.randn(CLASSES, 3, 4, 4, generator=generator), size=32, mode="bilinear")
    labels = torch.randint(CLASSES, (samples,), generator=generator)
    return templates[labels] + 2.0 * torch.randn(samples, 3, 32, 32, generator=generator), labels


class Recorder(Callback):
    """Per rank: each epoch's window (epoch start to last batch end), samples, steps and CPU seconds."""

    def __init__(self) -> None:
        self.epochs: list[dict[str, Any]] = []
        self._cpu_start = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        trainer.strategy.barrier()  # the ranks' clocks start together

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        now, self._cpu_start = time.time(), time.process_time()
        mode = getattr(trainer.strategy, "mode", "bsp")
        self.epochs.append(
            {
                "epoch": trainer.current_epoch,
                "mode": mode,
                "start": now,
                "end": now,
                "samples": 0,
                "steps": 0,
                "cpu_s": 0.0,
            }
        )

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        epoch = self.epochs[-1]
        epoch.update(end=time.time(), samples=epoch["samples"] + int(batch[1].shape[0]), steps=epoch["steps"] + 1)
        epoch["cpu_s"] = time.process_time() - self._cpu_start

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        metric = trainer.callback_metrics.get("val_acc")
        self.epochs[-1]["val_acc"] = None if metric is None else float(metric)


def train(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    L.seed_everything(args.seed, verbose=False)
    data = make_data(args.samples + args.val_samples, args.seed)
    train_set = TensorDataset(data[0][: args.samples], data[1][: args.samples])
    val_set = TensorDataset(data[0][args.samples :], data[1][args.samples :])
    recorder = Recorder()
    callbacks: list[Callback] = [recorder, ProgressReporter(args.out / "progress")]
    hetero = None
    timeout = timedelta(seconds=args.comm_timeout_s)
    strategy: Any = "auto" if args.standalone else DDPStrategy(process_group_backend="gloo", timeout=timeout)
    if args.method == "hetero" and not args.standalone:
        if args.split is None:
            hetero = HeteroBatchCallback()  # the controller as a user gets it: every setting at its default
        else:  # a fixed split: the callback only splits and weights
            hetero = HeteroBatchCallback(initial_batch_sizes=[int(b) for b in args.split.split(",")])
            hetero._adjust = lambda *_, **__: None
        callbacks.append(hetero)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, num_nodes=1 if args.standalone else int(os.environ["NUM_NODES"]),
        strategy=strategy, max_epochs=args.epochs, callbacks=callbacks, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    model = ResNetClassifier(args.lr, args.momentum)
    trainer.fit(
        model,
        train_dataloaders=DataLoader(train_set, batch_size=args.batch_size, shuffle=True),
        val_dataloaders=DataLoader(val_set, batch_size=512),
    )
    report = {
        "rank": trainer.global_rank, "epochs": recorder.epochs, "global_step": trainer.global_step,
        "final_split": None if hetero is None or hetero.batch_sizes is None else list(hetero.batch_sizes),
        "switches": None, "cpu_quota": cgroup_cpu_quota(),
    }  # fmt: skip
    if hetero is not None:
        tuner = hetero.tuner
        report["hetero"] = {
            "history": hetero.history,
            "costs": tuner.costs,
            "busy_s": tuner.busy_s,
            "sync_step_s": tuner.sync_step_s,
            "predicted_step_s": tuner.predicted_step_s(),
        }
    Path(args.out, f"report-rank{trainer.global_rank}.json").write_text(json.dumps(report))
    if dist.is_initialized():
        dist.destroy_process_group()  # an undestroyed gloo group can abort the interpreter at exit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for report-rank{k}.json (progress records in OUT/progress)")
    parser.add_argument("--method", choices=("ddp", "hetero"), default="ddp")
    parser.add_argument("--split", help="HeteroBatch at this fixed split (a,b,...), no adjustment")
    parser.add_argument("--standalone", action="store_true", help="train alone (the ideal at this quota)")
    parser.add_argument("--samples", type=int, default=8192, help="training samples (one epoch)")
    parser.add_argument("--val-samples", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=256, help="per-rank starting batch (ASP: every batch)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--comm-timeout-s", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    train(args)


if __name__ == "__main__":
    main()
