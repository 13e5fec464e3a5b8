"""Does asynchronous training keep BSP's accuracy with the user's own (BSP) hyper-parameters?

One recipe tuned for BSP (SGD lr 0.1, momentum 0.9, batch 32 per worker, a 32-64-4 MLP, 4 epochs) trained as each
of ``CONFIGS``; rank k slowed ``HL ** (k / (N - 1))``; per cell, accuracy and time paired with BSP by seed.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from benchmarks.harness import models
from benchmarks.harness.grid import Cell, workers_hl_axes
from benchmarks.harness.launch import RESULTS, run_json
from benchmarks.harness.record import table, write_json
from benchmarks.harness.stats import mean, mean_sd, median, seed_paired, within_budget
from lightning_hetero import AsyncPSStrategy, SlowdownEmulator, SyncSwitchCallback
from lightning_hetero.asp.compensation import AsynchronyCompensator
from lightning_hetero.async_ps import PSAdvanced
from lightning_hetero.switching import FixedFractionPolicy, SchedulePolicy
from lightning_hetero.switching.policies import share_in_epochs

CONFIGS = ("bsp", "asp_none", "asp", "hybrid", "asp_dc", "hybrid_none", "reverse")
#: the validation samples, and the hybrid's (and reverse's) BSP share of the epochs
VAL_SAMPLES, BSP_FRACTION = 2048, 0.25
#: the settings a run's child process is given
CHILD_FLAGS = ("epochs", "samples", "noise", "cost_s", "lr", "momentum", "batch_size", "throttle")


class EpochRecorder(models.TrainingTimes):
    """Rank 0, per epoch: mode, training seconds (validation excluded), validation accuracy, hyper-parameters."""

    def __init__(self) -> None:
        super().__init__(start_together=True)

    def extra(self, trainer: L.Trainer, mode: str) -> dict[str, Any]:
        metrics = trainer.callback_metrics
        names = ("momentum_effective", "lr_effective", "staleness")
        found = {name: float(metrics[f"ps/{name}"]) if f"ps/{name}" in metrics else None for name in names}
        return found | ({} if mode == "asp" else {"staleness": None})


def run_one(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    L.seed_everything(args.seed, verbose=False)
    train, val = models.classification_split(args.samples, VAL_SAMPLES, args.seed, args.noise)
    factors = models.slowdown_factors(args.n, args.level)
    recorder = EpochRecorder()
    callbacks: list[Callback] = [recorder]
    slowed = {rank: factor for rank, factor in enumerate(factors) if factor > 1.0}
    model = models.MLP(32, 4, [64], args.lr, args.momentum, args.cost_s, nn.Tanh)
    if slowed:
        callbacks.append(SlowdownEmulator(factors=slowed, throttle=args.throttle, cpu_clock=model.cpu_clock))
    compensation = None if args.config.endswith("_none") else ("dc" if args.config == "asp_dc" else "auto")
    hybrid = args.config.startswith("hybrid")
    mode = "bsp" if args.config == "bsp" or hybrid else "asp"
    switch = None
    if hybrid:
        switch = SyncSwitchCallback(FixedFractionPolicy(BSP_FRACTION), verbose=False)
    elif args.config == "reverse":
        asp_epochs = args.epochs - share_in_epochs(BSP_FRACTION, args.epochs)
        switch = SyncSwitchCallback(SchedulePolicy(f"asp:0-{asp_epochs - 1},bsp:{asp_epochs}-"), verbose=False)
    if switch is not None:
        callbacks.insert(0, switch)
    strategy = AsyncPSStrategy(
        mode=mode, asynchrony_compensation=compensation, fault_timeout_s=300,
        advanced=PSAdvanced(overlap_round_trip=True),
    )  # fmt: skip
    trainer = models.quiet_trainer(
        devices=args.n, strategy=strategy, max_epochs=args.epochs, callbacks=callbacks, num_sanity_val_steps=0
    )
    models.fit(trainer, model, train, val, args.batch_size)
    result = {"epochs": recorder.epochs, "server_summary": strategy.server_summary, "factors": factors}
    models.finish(trainer, args.out, result | {"switches": switch.switches if switch else []})


def launch(args: argparse.Namespace, config: str, workers: int, level: float, seed: int) -> dict[str, Any]:
    cell = {"run": config, "n": workers, "level": level, "seed": seed}
    command = lambda out: models.child_command("asp_accuracy", args, CHILD_FLAGS, **cell, out=out)  # noqa: E731
    load_before, started = os.getloadavg()[0], time.perf_counter()
    result = run_json(command)
    epochs = result["epochs"]
    summary = result["server_summary"] or {}
    asp_epochs = [e for e in epochs if e["mode"] == "asp"]
    return {
        "config": config,
        "workers": workers,
        "hl": level,
        "seed": seed,
        "final_acc": epochs[-1]["val_acc"],
        "acc_per_epoch": [e["val_acc"] for e in epochs],
        "modes": "".join("B" if e["mode"] == "bsp" else "A" for e in epochs),
        "train_s": sum(e["train_s"] for e in epochs),
        "staleness_mean": summary.get("staleness_mean"),
        "staleness_max": summary.get("staleness_max"),
        "updates": summary.get("updates"),
        "momentum_effective": [e["momentum_effective"] for e in epochs],
        "lr_effective": [e["lr_effective"] for e in epochs],
        "asp_momentum_effective_mean": mean(e["momentum_effective"] for e in asp_epochs),
        "switches": result["switches"],
        "factors": result["factors"],
        "wall_s": time.perf_counter() - started,
        "load_1min_before_after": [load_before, os.getloadavg()[0]],
    }


def compensation_cost_us(repeats: int = 20000) -> float:
    """Microseconds the server spends per update on the compensation (observe + rewrite one SGD param group)."""
    compensator = AsynchronyCompensator("auto", workers=4)
    started = time.perf_counter()
    for step in range(repeats):
        compensator.observe(step % 7)
        compensator.apply([{"lr": 0.1, "momentum": 0.9, "dampening": 0, "nesterov": False}])
    return (time.perf_counter() - started) / repeats * 1e6


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean +- sd per (workers, HL, config), with differences to BSP paired by seed (the seed also draws the data,
    so tasks differ in difficulty between seeds)."""
    rows = []
    for (workers, level, config), group, paired in seed_paired(runs, ["workers", "hl"], "bsp"):
        acc = mean_sd([r["final_acc"] for r in group])
        train_s = mean_sd([r["train_s"] for r in group])
        diff = mean_sd([100 * (r["final_acc"] - b["final_acc"]) for r, b in paired]) if paired else (None, None)
        ratio = mean_sd([r["train_s"] / b["train_s"] for r, b in paired]) if paired else (None, None)
        rows.append({
            "workers": workers, "hl": level, "config": config, "seeds": [r["seed"] for r in group],
            "acc_mean": acc[0], "acc_sd": acc[1], "train_s_mean": train_s[0], "train_s_sd": train_s[1],
            "acc_vs_bsp_points": diff[0], "acc_vs_bsp_points_sd": diff[1],
            "time_vs_bsp": ratio[0], "time_vs_bsp_sd": ratio[1],
            "staleness_mean": mean(r["staleness_mean"] for r in group),
            "staleness_max": max((r["staleness_max"] for r in group if r["staleness_max"] is not None), default=None),
            "asp_momentum_effective": mean(r["asp_momentum_effective_mean"] for r in group),
        })  # fmt: skip
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    header = ["N", "HL", "config", "seeds", "acc mean+-sd", "vs BSP pt (paired)", "train s", "vs BSP", "stal mean/max",
              "mom. in ASP"]  # fmt: skip
    cells = [
        [r["workers"], r["hl"], r["config"], len(r["seeds"]), f"{r['acc_mean']:.4f}+-{r['acc_sd']:.4f}",
         None if r["acc_vs_bsp_points"] is None else f"{r['acc_vs_bsp_points']:+.2f}+-{r['acc_vs_bsp_points_sd']:.2f}",
         r["train_s_mean"], None if r["time_vs_bsp"] is None else f"{r['time_vs_bsp']:.2f}x",
         None if r["staleness_mean"] is None else f"{r['staleness_mean']:.2f}/{r['staleness_max']}",
         r["asp_momentum_effective"]]
        for r in rows
    ]  # fmt: skip
    print(table(header, cells, ["", "g", "", "", "", "", ".1f", "", "", ".3f"]))


def cell_order(workers: list[int], levels: list[float]) -> list[tuple[int, float]]:
    """2 and 4 workers at the highest HL first, then more workers, then the lower HLs."""
    return [(n, level) for level in sorted(levels, reverse=True) for n in sorted(workers)]


def grid_axes(args: argparse.Namespace) -> dict[str, list[Cell] | str]:
    return workers_hl_axes(args, "cost_s")


def figures(payload: dict) -> dict[str, float]:
    """Per row (by position, so that a cell's scaled workers or levels are the same figure) and configuration other
    than BSP: accuracy against BSP in points, and speed against BSP (BSP's time over the configuration's)."""
    found = {}
    for i, row in enumerate(payload["rows"]):
        if row["config"] != "bsp" and row["acc_vs_bsp_points"] is not None:
            found[f"row {i} {row['config']}: accuracy vs BSP, points"] = row["acc_vs_bsp_points"]
            found[f"row {i} {row['config']}: speed vs BSP"] = 1 / row["time_vs_bsp"]
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    models.add_study_flags(parser, CONFIGS, "bsp,asp_none,asp,hybrid", workers="2,4,8", hl="4,1", budget_s=3000.0)
    parser.add_argument("--out", type=Path, default=RESULTS / "asp_accuracy.json")
    parser.add_argument("--cost-s", type=float, default=0.0008, help="emulated compute seconds per sample")
    parser.add_argument("--batch-size", type=int, default=32)


def main(args: argparse.Namespace) -> None:
    if args.run is not None:
        args.config = args.run
        run_one(args)
        return
    configs = models.chosen(args.configs, CONFIGS)
    workers = [int(n) for n in args.workers.split(",")]
    levels = [float(h) for h in args.hl.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    runs: list[dict[str, Any]] = []
    ran, skipped = [], []
    cells = [{"workers": n, "hl": level, "seed": seed} for n, level in cell_order(workers, levels) for seed in seeds]
    for cell in within_budget(cells, args.budget_s, skipped):
        n, level, seed = cell.values()
        for config in configs:
            runs.append(run := launch(args, config, n, level, seed))
            print(
                f"N={n} HL{level:g} seed {seed} {config:>11}: acc {run['final_acc']:.4f} "
                f"({' '.join(f'{a:.3f}' for a in run['acc_per_epoch'])}, {run['modes']}) "
                f"train {run['train_s']:.1f} s, staleness {run['staleness_mean']}",
                flush=True,
            )
        ran.append(cell)
    rows = summarise(runs)
    print_table(rows)
    cost_us = compensation_cost_us()
    step_us = median(r["train_s"] / r["updates"] * 1e6 for r in runs if r["config"] == "asp" and r["updates"])
    share = "" if step_us is None else f" ({cost_us / step_us:.3%} of the median ASP update interval)"
    print(f"compensation cost: {cost_us:.1f} us per update{share}")
    report = {
        "cells_ran": ran,
        "cells_skipped_for_budget": skipped,
        "compensation_cost_us_per_update": cost_us,
        "median_asp_update_interval_us": step_us,
        "rows": rows,
        "runs": runs,
    }
    write_json(args.out, report)
