"""Runs for the controller scenario: several fits in one launch of N DDP ranks (start-up paid once, the same load);
rank 0 writes every step's start time, the ranks' local sizes and the callback's history.
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch import nn

from benchmarks.harness.models import MLP, StepClock, quiet_trainer
from lightning_hetero import HeteroBatchCallback, SlowdownEmulator
from lightning_hetero.synthetic import SyntheticClassificationDataModule


def one_run(args: argparse.Namespace, run: dict, world: int) -> dict | None:
    L.seed_everything(0, verbose=False)
    schedule = {0: dict(enumerate(float(f) for f in args.factors.split(",")))}
    if args.factors_after:
        schedule[args.switch_step] = dict(enumerate(float(f) for f in args.factors_after.split(",")))
    model = MLP(32, 4, [128], 0.1, 0.0, args.cost_s, nn.Tanh, args.overhead_s, args.compute, log_loss=True)
    clock = StepClock()
    callbacks: list = [clock, SlowdownEmulator(schedule=schedule, unit="step", throttle=args.throttle,
                                              cpu_clock=model.cpu_clock)]  # fmt: skip
    hetero = None
    if run["kind"] != "ddp":
        settings = {"adjust_every_n_steps": args.adjust_every, "initial_batch_sizes": run.get("split")}
        # a run's options override the launch's settings (adjust_every_n_steps=None: the callback's default cadence)
        hetero = HeteroBatchCallback(**settings | {"warmup_steps": 2, "verbose": False} | run.get("options", {}))
        if run["kind"] == "static":
            hetero._adjust = lambda *args, **kwargs: None  # a fixed split: the callback only splits and weights
        callbacks.insert(0, hetero)
    strategy = DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=300))
    trainer = quiet_trainer(devices=world, strategy=strategy, max_steps=args.steps, max_epochs=1, callbacks=callbacks,
                            limit_val_batches=0)  # fmt: skip
    data = SyntheticClassificationDataModule(
        num_samples=args.global_batch * (args.steps + 1), batch_size=args.global_batch // world, num_features=32
    )
    trainer.fit(model, datamodule=data)
    sizes = clock.gather_sizes(trainer)
    if not trainer.is_global_zero:
        return None
    return {
        "run": run,
        "starts": clock.starts,
        "local_sizes": sizes,
        "history": [] if hetero is None or run["kind"] == "static" else hetero.history,
        "summary": hetero.summary() if hetero is not None and run["kind"] == "hetero" else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--runs", required=True, help="JSON list of {kind, split?, options?}")
    parser.add_argument("--factors", default="1,4")
    parser.add_argument("--factors-after", default="")
    parser.add_argument("--switch-step", type=int, default=0)
    parser.add_argument("--throttle", choices=["sleep", "cfs"], default="sleep")
    parser.add_argument("--compute", choices=["sleep", "spin"], default="sleep", help="emulated compute: sleep or CPU")
    parser.add_argument("--cost-s", type=float, default=0.001)
    parser.add_argument("--overhead-s", type=float, default=0.001)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=96)
    parser.add_argument("--adjust-every", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    world = len(args.factors.split(","))
    results = [one_run(args, run, world) for run in json.loads(args.runs)]
    if torch.distributed.get_rank() == 0:
        args.out.write_text(json.dumps(results))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
