"""One configuration of the benchmark matrix (``benchmarks/scenarios/matrix.py``); Lightning's launcher re-runs this script for
the other ranks.

The model is a small MLP on generated data whose training step also sleeps ``--cost-s`` seconds per sample (an
emulated per-sample compute cost, the same on every rank); ``SlowdownEmulator`` then stretches rank k's compute
window by its factor. Sleeping rather than spinning keeps four emulated machines workable on a 2-core host. Each rank
writes ``OUT/rank{k}.json``: per-epoch training windows (validation excluded), per-step local batch sizes, CPU seconds
actually used and seconds slept, and what the method's callback or strategy recorded.
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader

from benchmarks.harness.models import EpochWindows, ReluMLP, classification_split, quiet_trainer
from lightning_hetero import (
    AsyncPSStrategy,
    HeteroBatchCallback,
    PhaseHyperparams,
    SlowdownEmulator,
    SyncSwitchCallback,
)

METHODS = ("ddp", "hetero", "asp", "hybrid")
FEATURES, CLASSES, HIDDEN, NOISE = 32, 10, 128, 2.5


class Recorder(EpochWindows):
    """Per rank: epoch windows (first batch start to last batch end), per-step batch sizes, CPU and sleep totals."""

    def __init__(self, emulator: SlowdownEmulator | None) -> None:
        super().__init__()
        self.emulator = emulator
        self.steps: list[tuple[float, int]] = []
        self.stretch_s = 0.0
        self.first_stretches_s: list[float] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self.steps.append((self.epochs[-1]["end"], int(batch[1].shape[0])))
        if self.emulator is not None:
            self.stretch_s += self.emulator.batch_stretch_s
            if len(self.first_stretches_s) < 3:
                self.first_stretches_s.append(self.emulator.batch_stretch_s)


def train(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    L.seed_everything(args.seed, verbose=False)
    factors = [float(f) for f in args.factors.split(",")]
    train_set, val_set = classification_split(args.samples, args.val_samples, args.seed, NOISE, FEATURES, CLASSES)

    slowed = {rank: factor for rank, factor in enumerate(factors) if factor > 1.0}
    emulator = SlowdownEmulator(factors=slowed) if slowed else None
    recorder = Recorder(emulator)
    callbacks: list[Callback] = [recorder] + ([emulator] if emulator else [])
    hetero = switch = None
    if args.method == "ddp":
        strategy: Any = DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=args.comm_timeout_s))
    elif args.method == "hetero":
        strategy = DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=args.comm_timeout_s))
        hetero = HeteroBatchCallback(adjust_every_n_steps=args.adjust_every, warmup_steps=2, verbose=False)
        callbacks.append(hetero)
    elif args.method == "asp":
        strategy = AsyncPSStrategy(mode="asp", fault_timeout_s=args.comm_timeout_s)
    else:
        strategy = AsyncPSStrategy(mode="bsp", fault_timeout_s=args.comm_timeout_s)
        hyperparams = None
        if args.hybrid_asp_lr_scale != 1.0 or args.hybrid_asp_momentum_ramp:
            asp = PhaseHyperparams(args.hybrid_asp_lr_scale, momentum_ramp_steps=args.hybrid_asp_momentum_ramp)
            hyperparams = {"asp": asp}
        switch = SyncSwitchCallback(args.hybrid_schedule, hyperparams=hyperparams, verbose=False)
        callbacks.insert(0, switch)

    # 32-128-128-10 (22k parameters); the training step sleeps cost_s per sample
    model = ReluMLP(FEATURES, CLASSES, [HIDDEN, HIDDEN], args.lr, args.momentum, cost_s=args.cost_s)
    trainer = quiet_trainer(
        devices=len(factors),
        strategy=strategy,
        max_epochs=args.epochs,
        callbacks=callbacks,
        num_sanity_val_steps=0,
    )
    trainer.fit(
        model,
        train_dataloaders=DataLoader(train_set, batch_size=args.batch_size, shuffle=True),
        val_dataloaders=DataLoader(val_set, batch_size=512),
    )
    report = {
        "rank": trainer.global_rank,
        "factor": factors[trainer.global_rank],
        "epochs": recorder.epochs,
        "steps": recorder.steps,
        "slept_s": model.slept_s + recorder.stretch_s,
        "first_stretches_s": recorder.first_stretches_s,
        "global_step": trainer.global_step,
        "hetero_history": None if hetero is None else hetero.history,
        "final_split": None if hetero is None or hetero.batch_sizes is None else list(hetero.batch_sizes),
        "server_summary": getattr(trainer.strategy, "server_summary", None),
        "switches": None if switch is None else switch.switches,
    }
    Path(args.out, f"rank{trainer.global_rank}.json").write_text(json.dumps(report))
    if dist.is_initialized():
        dist.destroy_process_group()  # an undestroyed gloo group can abort the interpreter at exit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for rank{k}.json")
    parser.add_argument("--method", choices=METHODS, required=True)
    parser.add_argument("--factors", required=True, help="slowdown factor per rank, e.g. 1,5.333,5.333,8")
    parser.add_argument("--cost-s", type=float, default=0.0005, help="emulated compute per sample at factor 1")
    parser.add_argument("--samples", type=int, default=3072, help="training samples (one epoch)")
    parser.add_argument("--val-samples", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=64, help="per-rank starting batch (ASP: every batch)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--adjust-every", type=int, default=4, help="HeteroBatch: adjust every n steps")
    parser.add_argument("--hybrid-schedule", default="bsp:0-1,asp:2-", help="hybrid: SyncSwitchCallback's schedule")
    parser.add_argument("--hybrid-asp-lr-scale", type=float, default=1.0, help="hybrid: LR scale in its ASP phase")
    parser.add_argument("--hybrid-asp-momentum-ramp", type=int, default=0, help="hybrid: momentum ramp steps in ASP")
    parser.add_argument("--comm-timeout-s", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=0)
    train(parser.parse_args())


if __name__ == "__main__":
    main()
