"""Runs for ``bench_controller.py``: several fits in one launch of N DDP ranks; Lightning's launcher re-runs this
script for the other ranks, and the fits share the process group (start-up is paid once, and the fits of one launch
see the same machine load).

Each run is one of: ``hetero`` (HeteroBatchCallback adjusting every ``--adjust-every`` steps; with
``"refine": false`` its policy never refines below the deadband, for an ablation), ``static`` (the callback's
batch-weighted DDP with a fixed split) or ``ddp`` (plain DDP, equal batches). Slowdowns come from
``SlowdownEmulator``: The model's compute is (``--compute spin``: real CPU time instead of) a sleep of ``--overhead-s + --cost-s x batch`` (so ranks do not compete for this host's
cores) plus a small MLP. ``--throttle sleep`` stretches it by the rank's factor; ``--throttle cfs`` gives the rank a
CFS quota of ``1 / factor`` CPUs per 100 ms, charged its CPU time plus the emulated (slept) compute. Rank 0 writes, per run, every step's start time, global and local sizes,
and the callback's history, as JSON.
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

from lightning_hetero import HeteroBatchCallback, SlowdownEmulator
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule


class SleepCostModel(MLPClassifier):
    """A small MLP whose forward also sleeps ``overhead_s + cost_s`` per sample: an emulated machine that uses no
    CPU, so ranks do not compete for this host's cores. ``emulated_cpu_s`` counts the sleeps, for the CFS quota."""

    def __init__(self, cost_s: float, overhead_s: float) -> None:
        super().__init__(num_features=32, hidden=128)
        self.cost_s, self.overhead_s = cost_s, overhead_s
        self.emulated_cpu_s = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seconds = self.overhead_s + self.cost_s * x.shape[0]
        time.sleep(seconds)
        self.emulated_cpu_s += seconds
        return super().forward(x)


class SpinCostModel(MLPClassifier):
    """A small MLP whose forward also spends ``overhead_s + cost_s`` per sample of real CPU time (a busy loop on the
    process's CPU clock): ranks compete for this host's cores as real compute does, and a CFS quota throttles it."""

    def __init__(self, cost_s: float, overhead_s: float) -> None:
        super().__init__(num_features=32, hidden=128)
        self.cost_s, self.overhead_s = cost_s, overhead_s
        self.emulated_cpu_s = 0.0  # nothing emulated: the quota is charged the CPU clock alone

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        end = time.process_time() + self.overhead_s + self.cost_s * x.shape[0]
        while time.process_time() < end:
            pass
        return super().forward(x)


class NoRefinement(Callback):
    """Turns off the policy's refinements below the deadband (the policy is built with the train loader)."""

    def __init__(self, hetero: HeteroBatchCallback) -> None:
        self.hetero = hetero

    def on_train_start(self, trainer, pl_module):
        assert self.hetero.tuner is not None
        self.hetero.tuner.policy.refine_gain = None


class StepClock(Callback):
    def __init__(self) -> None:
        self.starts: list[float] = []
        self.local_sizes: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.starts.append(time.perf_counter())
        self.local_sizes.append(int(batch[0].shape[0]))


def one_run(args: argparse.Namespace, run: dict, world: int) -> dict | None:
    L.seed_everything(0, verbose=False)
    factors = [float(f) for f in args.factors.split(",")]
    schedule = {0: dict(enumerate(factors))}
    if args.factors_after:
        schedule[args.switch_step] = dict(enumerate(float(f) for f in args.factors_after.split(",")))
    model = (SpinCostModel if args.compute == "spin" else SleepCostModel)(args.cost_s, args.overhead_s)
    # CFS: the quota is charged the rank's CPU time plus its emulated (slept) compute
    emulator = SlowdownEmulator(
        schedule=schedule,
        unit="step",
        throttle=args.throttle,
        cpu_clock=lambda: time.process_time() + model.emulated_cpu_s,
    )
    clock = StepClock()
    callbacks: list[Callback] = [clock, emulator]
    hetero = None
    if run["kind"] != "ddp":
        settings = {"adjust_every_n_steps": args.adjust_every, "initial_batch_sizes": run.get("split")}
        # a run's options override the launch's settings (adjust_every_n_steps=None: the callback's default cadence)
        hetero = HeteroBatchCallback(**settings | {"warmup_steps": 2, "verbose": False} | run.get("options", {}))
        if run["kind"] == "static":
            hetero._adjust = lambda *args, **kwargs: None  # a fixed split: the callback only splits and weights
        callbacks.insert(0, hetero)
        if run.get("refine") is False:
            callbacks.append(NoRefinement(hetero))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=300)),
        max_steps=args.steps,
        max_epochs=1,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    data = SyntheticClassificationDataModule(
        num_samples=args.global_batch * (args.steps + 1), batch_size=args.global_batch // world, num_features=32
    )
    trainer.fit(model, datamodule=data)
    gathered: list = [None] * world
    torch.distributed.all_gather_object(gathered, clock.local_sizes)
    if not trainer.is_global_zero:
        return None
    return {
        "run": run,
        "starts": clock.starts,
        "local_sizes": gathered,
        "history": [] if hetero is None or run["kind"] == "static" else hetero.history,
        "summary": hetero.summary() if hetero is not None and run["kind"] == "hetero" else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--runs", required=True, help="JSON list of {kind, split?, options?, refine?}")
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
