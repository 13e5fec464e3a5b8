"""What per-step logging costs inside a training step: ``self.log`` of a number against ``EpochLog``.
Variants ``log_float``, ``log_float_sync`` and ``epoch_log`` (``AsyncPSStrategy``'s path); medians over steps.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.harness.launch import RESULTS as RESULTS_DIR
from benchmarks.harness.models import quiet_trainer
from benchmarks.harness.record import write_json
from benchmarks.harness.stats import rotating_order
from lightning_hetero.async_ps.runtime.reporting import EpochLog

VARIANTS = ("log_float", "log_float_sync", "epoch_log")
WARMUP_STEPS = 20

#: why ``--grid`` does not apply
NO_GRID = "one process timing its own logging calls: no workers, emulation or epochs to vary"


class LoggingModule(L.LightningModule):
    """Times two logging calls of ``variant`` in every training step (``self.step_s``)."""

    def __init__(self, variant: str) -> None:
        super().__init__()
        self.variant = variant
        self.layer = torch.nn.Linear(4, 2)
        self.epoch_log = EpochLog(gather=lambda tensor: tensor.unsqueeze(0))
        self.step_s: list[float] = []

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        start = time.perf_counter()
        for name in ("a", "b"):
            if self.variant == "epoch_log":
                self.epoch_log.report(self, name, 1.0, self.current_epoch)
            else:
                sync = self.variant == "log_float_sync"
                self.log(name, 1.0, on_step=False, on_epoch=True, batch_size=1, sync_dist=sync, rank_zero_only=not sync)
        self.step_s.append(time.perf_counter() - start)
        return self.layer(batch[0]).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def measure(variant: str, steps: int) -> float:
    """Median µs per step that the two logging calls of ``variant`` took, after :data:`WARMUP_STEPS` steps."""
    module = LoggingModule(variant)
    data = DataLoader(TensorDataset(torch.randn(32 * (steps + WARMUP_STEPS), 4)), batch_size=32)
    quiet_trainer(max_epochs=1).fit(module, data)
    return 1e6 * statistics.median(module.step_s[WARMUP_STEPS:])


def summarise(each: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """Per variant: the median over repeats, the repeats, and the ratio to ``epoch_log``'s median."""
    base = statistics.median(each["epoch_log"]) if "epoch_log" in each else None
    summary = {}
    for variant, values in each.items():
        median = statistics.median(values)
        summary[variant] = {
            "us_per_step_median": median,
            "us_per_step_each": values,
            "over_epoch_log": median / base if base else None,
        }
    return summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=400, help="timed steps per run (after a warm-up)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "log_cost.json")


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    each: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for variant in rotating_order(VARIANTS, args.repeats):  # the variants interleaved, the first one rotating
        each[variant].append(measure(variant, args.steps))
    summary = summarise(each)
    print(f"{'variant':16} {'us/step (2 calls)':>18} {'x epoch_log':>12}  repeats")
    for variant, row in summary.items():
        ratio = "-" if row["over_epoch_log"] is None else f"{row['over_epoch_log']:.1f}"
        repeats = ", ".join(f"{v:.0f}" for v in row["us_per_step_each"])
        print(f"{variant:16} {row['us_per_step_median']:18.1f} {ratio:>12}  {repeats}")
    result = {"conditions": {"torch_threads": 1, "warmup_steps": WARMUP_STEPS}, "summary": summary}
    write_json(args.json, result, indent=2)
