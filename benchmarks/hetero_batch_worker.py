"""One training run for the hetero_batch scenario: an MLP sleeping ``cost_s x factor x batch`` per step (the factor
may change at ``--switch-step``); rank 0 writes each step's end time and global batch size.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch import nn

from benchmarks.harness.models import MLP, StepClock, finish, quiet_trainer
from lightning_hetero import HeteroBatchCallback
from lightning_hetero.synthetic import SyntheticClassificationDataModule


class FactorMLP(MLP):
    """The rank's factor, ``factors`` before step ``switch_step`` and ``factors_after`` from it, scales the cost."""

    def __init__(self, cost_s: float, factors: list[float], factors_after: list[float] | None, switch_step: int):
        super().__init__(32, 4, [128], 0.1, 0.0, cost_s, nn.Tanh, log_loss=True)
        self.factors, self.factors_after, self.switch_step = factors, factors_after, switch_step

    def step_cost_s(self, samples: int) -> float:
        after = self.factors_after is not None and self.global_step >= self.switch_step
        return super().step_cost_s(samples) * (self.factors_after if after else self.factors)[self.global_rank]


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
    hetero = None
    if args.method == "hetero":
        settings = {"adjust_every_n_steps": args.adjust_every, "warmup_steps": 2} if args.adjust_every else {}
        hetero = HeteroBatchCallback(**settings, verbose=False)
    devices = 1 if args.method == "single" else len(factors)
    strategy = "auto" if devices == 1 else DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=120))
    trainer = quiet_trainer(devices=devices, strategy=strategy, max_epochs=args.epochs, limit_val_batches=0,
                            callbacks=[clock] if hetero is None else [clock, hetero])  # fmt: skip
    model = FactorMLP(args.cost_s, factors, after, args.switch_step)
    trainer.fit(model, datamodule=SyntheticClassificationDataModule(num_samples=args.samples, batch_size=args.batch))
    sizes = clock.gather_sizes(trainer)
    result = {
        "times": clock.ends,
        "global_sizes": [sum(step) for step in zip(*sizes, strict=True)],
        "local_sizes": sizes,
        "history": [] if hetero is None else hetero.history,
        "final_split": None if hetero is None else list(hetero.batch_sizes),
    }
    finish(trainer, args.out, result)


if __name__ == "__main__":
    main()
