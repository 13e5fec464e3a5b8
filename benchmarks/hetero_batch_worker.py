"""One training run for the hetero_batch scenario; Lightning's launcher re-runs this script for the other ranks.

The model is an MLP plus an emulated per-sample compute cost: ``cost_s x factor x batch`` seconds of sleep in the
forward pass, where ``factor`` is the rank's slowdown (it may change at ``--switch-step``). Sleeping rather than
spinning keeps two emulated machines from competing for this host's two cores. Rank 0 writes per-step timestamps
and global batch sizes as JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy

from benchmarks.harness.models import quiet_trainer
from lightning_hetero import HeteroBatchCallback
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule


class CostModel(MLPClassifier):
    def __init__(self, cost_s: float, factors: list[float], factors_after: list[float] | None, switch_step: int):
        super().__init__(hidden=128)
        self.cost_s, self.factors, self.factors_after, self.switch_step = cost_s, factors, factors_after, switch_step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        factors = self.factors
        if self.factors_after is not None and self.global_step >= self.switch_step:
            factors = self.factors_after
        time.sleep(self.cost_s * factors[self.global_rank] * x.shape[0])
        return super().forward(x)


class StepClock(Callback):
    def __init__(self) -> None:
        self.times: list[float] = []
        self.local_sizes: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.times.append(time.perf_counter())
        self.local_sizes.append(int(batch[0].shape[0]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--method", choices=["ddp", "hetero", "single"], required=True)
    parser.add_argument("--factors", default="1,4")
    parser.add_argument("--factors-after", default=None)
    parser.add_argument("--switch-step", type=int, default=10**9)
    parser.add_argument("--cost-s", type=float, default=0.0003)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--adjust-every", type=int, default=8, help="0: HeteroBatchCallback() at its defaults")
    args = parser.parse_args()
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    factors = [float(f) for f in args.factors.split(",")]
    after = None if args.factors_after is None else [float(f) for f in args.factors_after.split(",")]
    clock = StepClock()
    callbacks: list[Callback] = [clock]
    hetero = None
    if args.method == "hetero":
        settings = {"adjust_every_n_steps": args.adjust_every, "warmup_steps": 2} if args.adjust_every else {}
        hetero = HeteroBatchCallback(**settings, verbose=False)
        callbacks.append(hetero)
    devices = 1 if args.method == "single" else len(factors)
    strategy = "auto" if devices == 1 else DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=120))
    trainer = quiet_trainer(
        devices=devices,
        strategy=strategy,
        max_epochs=args.epochs,
        callbacks=callbacks,
        limit_val_batches=0,
    )
    model = CostModel(args.cost_s, factors, after, args.switch_step)
    trainer.fit(model, datamodule=SyntheticClassificationDataModule(num_samples=args.samples, batch_size=args.batch))
    sizes = [clock.local_sizes]
    if devices > 1:
        gathered = [None] * devices
        torch.distributed.all_gather_object(gathered, clock.local_sizes)
        sizes = gathered
    if trainer.is_global_zero:
        result = {
            "times": clock.times,
            "global_sizes": [sum(step) for step in zip(*sizes, strict=True)],
            "local_sizes": sizes,
            "history": [] if hetero is None else hetero.history,
            "final_split": None if hetero is None else list(hetero.batch_sizes),
        }
        args.out.write_text(json.dumps(result))
    if torch.distributed.is_initialized():
        # gloo can abort at interpreter exit ("terminate called without an active exception") if left alive
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
