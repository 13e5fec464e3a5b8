"""BSP vs ASP vs the BSP-then-ASP hybrid (SyncSwitchCallback) on a generated task with emulated heterogeneity.

Each configuration trains the same model on the same data with ``AsyncPSStrategy`` on N CPU processes, rank 1
slowed by ``SlowdownEmulator`` (it computes ``--slowdown`` times slower). Rank 0 records, per epoch, the training
time (validation excluded) and the validation accuracy. The table shows the final accuracy, the total training time,
the time to reach ``--target`` accuracy and the cost of each mode switch. A last run measures the switch cost for
the CIFAR ResNet-20 of ``examples/`` (0.27M parameters, SGD with momentum) over six alternating switches.

Usage:
    python benchmarks/bench_sync_switch.py [--workers 2] [--epochs 12] [--slowdown 4] [--bsp-fraction 0.25]

Results go to ``benchmarks/results/sync_switch_<N>workers.json``. Lightning's launcher re-runs this script for ranks 1..N-1,
so each configuration runs in its own child process (``--config``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero.emulation.slowdown import SlowdownEmulator
from lightning_hetero.ps import AsyncPSStrategy
from lightning_hetero.switching import FixedFractionPolicy
from lightning_hetero.switching.callback import SyncSwitchCallback
from lightning_hetero.synthetic import make_classification

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CONFIGS = ("bsp", "asp", "hybrid")
ALTERNATING = "bsp:0,asp:1,bsp:2,asp:3,bsp:4,asp:5,bsp:6-"


class DeepMLP(L.LightningModule):
    """A 4-hidden-layer perceptron: enough compute per step that the emulated slowdown, not Lightning's per-step
    overhead, sets the pace."""

    def __init__(self, num_features: int, num_classes: int, hidden: int, lr: float, momentum: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        layers: list[nn.Module] = []
        width = num_features
        for _ in range(4):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        self.net = nn.Sequential(*layers, nn.Linear(width, num_classes))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(-1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=self.hparams.momentum)


class EpochRecorder(Callback):
    """Per epoch: training seconds (validation excluded), the mode and the validation accuracy."""

    def __init__(self) -> None:
        self.epochs: list[dict[str, float | str]] = []
        self._start = 0.0
        self._val_s = 0.0
        self._val_start = 0.0
        self._mode = ""

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start, self._val_s = time.perf_counter(), 0.0
        self._mode = trainer.strategy.mode

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._val_s += time.perf_counter() - self._val_start

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.epochs.append(
            {
                "epoch": trainer.current_epoch,
                "mode": self._mode,
                "train_s": time.perf_counter() - self._start - self._val_s,
                "val_acc": float(trainer.callback_metrics["val_acc"]),
            }
        )


def measure_switch_cost(args: argparse.Namespace) -> None:
    """ResNet-20 on generated CIFAR-shaped images, switching mode every epoch; rank 0 writes the switch costs."""
    sys.path.insert(0, str(ROOT))  # the ResNet-20 lives in the examples package at the repository root
    from examples.image_classification.data import make_cifar_like
    from examples.image_classification.model import ImageClassifier

    dataset, _ = make_cifar_like(256)
    model = ImageClassifier(arch="resnet20", lr=0.05)
    switch = SyncSwitchCallback(ALTERNATING, verbose=False)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.workers,
        strategy=AsyncPSStrategy(mode="bsp"),
        max_epochs=7,
        callbacks=[switch],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(model, train_dataloaders=DataLoader(dataset, batch_size=16, shuffle=True))
    if trainer.is_global_zero:
        parameters = sum(p.numel() for p in model.parameters())
        Path(args.out).write_text(json.dumps({"parameters": parameters, "switches": switch.switches}))


def run_config(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    if args.config == "switch_cost":
        measure_switch_cost(args)
        return
    data = make_classification(args.samples * 3 // 2, args.features, args.classes, seed=0, noise=args.noise).tensors
    train = TensorDataset(data[0][: args.samples], data[1][: args.samples])
    val = TensorDataset(data[0][args.samples :], data[1][args.samples :])
    model = DeepMLP(args.features, args.classes, args.hidden, args.lr, args.momentum)
    recorder = EpochRecorder()
    callbacks: list[Callback] = [recorder, SlowdownEmulator(factors={1: args.slowdown})]
    switch = None
    if args.config == "hybrid":
        switch = SyncSwitchCallback(FixedFractionPolicy(args.bsp_fraction), verbose=False)
        callbacks.insert(0, switch)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.workers,
        strategy=AsyncPSStrategy(mode="asp" if args.config == "asp" else "bsp"),
        max_epochs=args.epochs,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(
        model,
        train_dataloaders=DataLoader(train, batch_size=args.batch_size, shuffle=True),
        val_dataloaders=DataLoader(val, batch_size=1024),
    )
    if trainer.is_global_zero:
        result = {"config": args.config, "epochs": recorder.epochs, "switches": switch.switches if switch else []}
        Path(args.out).write_text(json.dumps(result))


def launch(config: str) -> dict:
    """Run one configuration in a child process (Lightning's launcher starts its other ranks from it)."""
    out = RESULTS / f".sync_switch_{config}.json"
    command = [sys.executable, __file__, *sys.argv[1:], "--config", config, "--out", str(out)]
    env = {key: value for key, value in os.environ.items() if key != "MASTER_PORT"}
    subprocess.run(command, check=True, timeout=1800, env=env, stdout=subprocess.DEVNULL)
    result = json.loads(out.read_text())
    out.unlink()
    return result


def time_to(epochs: list[dict], target: float) -> float | None:
    elapsed = 0.0
    for record in epochs:
        elapsed += record["train_s"]
        if record["val_acc"] >= target:
            return elapsed
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="processes (2-4 on CPU)")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--slowdown", type=float, default=4.0, help="rank 1 computes this many times slower")
    parser.add_argument("--bsp-fraction", type=float, default=0.25, help="the hybrid's BSP share")
    parser.add_argument("--target", type=float, default=None, help="accuracy target (default: BSP's final - 0.5 pt)")
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--noise", type=float, default=3.0)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--config", choices=(*CONFIGS, "switch_cost"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.config is not None:
        run_config(args)
        return

    RESULTS.mkdir(parents=True, exist_ok=True)
    runs = {config: launch(config) for config in (*CONFIGS, "switch_cost")}
    resnet = runs.pop("switch_cost")

    bsp_final = runs["bsp"]["epochs"][-1]["val_acc"]
    target = args.target if args.target is not None else bsp_final - 0.005
    rows = []
    for config, run in runs.items():
        epochs = run["epochs"]
        rows.append(
            {
                "config": config,
                "final_acc": epochs[-1]["val_acc"],
                "best_acc": max(e["val_acc"] for e in epochs),
                "train_s": sum(e["train_s"] for e in epochs),
                "time_to_target_s": time_to(epochs, target),
                "modes": "".join("B" if e["mode"] == "bsp" else "A" for e in epochs),
                "switch_cost_s": [s["cost_s"] for s in run["switches"]],
            }
        )
    print(f"target accuracy {target:.4f}; rank 1 {args.slowdown}x slower; {args.workers} workers; {args.epochs} epochs")
    print(f"{'config':>7} {'final acc':>9} {'train s':>8} {'to target s':>11} {'vs BSP':>7}  modes")
    bsp_time = rows[0]["train_s"]
    for row in rows:
        to_target = "never" if row["time_to_target_s"] is None else f"{row['time_to_target_s']:.1f}"
        print(
            f"{row['config']:>7} {row['final_acc']:>9.4f} {row['train_s']:>8.1f} {to_target:>11} "
            f"{row['train_s'] / bsp_time:>6.2f}x  {row['modes']}"
        )
    for row in rows:
        for cost in row["switch_cost_s"]:
            print(f"{row['config']}: switch cost {cost * 1000:.1f} ms")
    for direction in ("bsp", "asp"):
        costs = [s["cost_s"] * 1000 for s in resnet["switches"] if s["to"] == direction]
        print(
            f"ResNet-20 ({resnet['parameters'] / 1e6:.2f}M parameters), into {direction.upper()}: "
            f"{', '.join(f'{c:.1f}' for c in costs)} ms"
        )
    parameters = sum(p.numel() for p in DeepMLP(args.features, args.classes, args.hidden, 0.1, 0.0).parameters())
    report = {
        "conditions": {
            **{key: value for key, value in vars(args).items() if key not in ("config", "out")},
            "target": target,
            "parameters": parameters,
            "torch": torch.__version__,
            "lightning": L.__version__,
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "emulation": "SlowdownEmulator sleeps on rank 1 (compute stretched, CPU not throttled)",
        },
        "rows": rows,
        "resnet20_switch_cost": resnet,
        "epochs": {config: run["epochs"] for config, run in runs.items()},
    }
    path = RESULTS / f"sync_switch_{args.workers}workers.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
