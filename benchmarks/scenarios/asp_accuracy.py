"""Does asynchronous training keep BSP's accuracy with the user's own (BSP) hyper-parameters?

One recipe, tuned for synchronous training (SGD lr 0.1, momentum 0.9, batch 32 per worker, a 32-64-4 MLP on
generated 4-class data, 4 epochs), trained by ``AsyncPSStrategy`` in four ways, side by side:

- ``bsp``: synchronous all-reduce (DDP semantics) throughout;
- ``asp_none``: ASP with ``asynchrony_compensation=None`` (the user's hyper-parameters as they are);
- ``asp``: ASP with the default settings (``asynchrony_compensation="auto"``, ``overlap_round_trip=True``);
- ``hybrid``: ``AsyncPSStrategy(mode="bsp")`` + ``SyncSwitchCallback(FixedFractionPolicy(0.25))``, default settings;
- optional: ``asp_dc`` (``asynchrony_compensation="dc"``), ``hybrid_none`` (the hybrid without compensation),
  ``reverse`` (the hybrid's phases in the opposite order: ASP first, then BSP for the last epochs) and
  ``asp_textbook`` (``asp`` with ``overlap_round_trip=False``: each worker waits for its reply; in results from
  before issue 25, ``asp`` was textbook ASP and ``asp_overlap`` today's default).

Compute is emulated by sleeping ``--cost-s`` per sample in the training step, so that 8 workers fit on a 2-core host;
heterogeneity level HL (fastest / slowest) slows rank k by ``HL ** (k / (N - 1))`` with ``SlowdownEmulator`` (rank 0,
which hosts the server, is the fastest); ``--throttle cfs`` slows them by a CPU quota instead (``SlowdownEmulator``'s
CFS mode, the sleeps charged as CPU time). Cells: workers x HL x seed; within a cell the configurations run one after
another, so their comparison is side by side on the same host load.

Usage:
    python -m benchmarks run asp_accuracy [--quick] [--workers 2,4,8] [--hl 1,4] [--seeds 0,1,2]
        [--configs bsp,asp_none,asp,hybrid] [--budget-s 2400] [--throttle sleep|cfs]

Writes ``benchmarks/results/asp_accuracy.json`` (``--out``): every run (final and per-epoch accuracy, training time,
staleness, the hyper-parameters in force per epoch) and mean +- sd per cell; prints a table; draws
``asp_accuracy.png`` when matplotlib is installed. ``--budget-s`` stops starting new cells after that many seconds
(cells are ordered 2 and 4 workers at HL4 first, then 8 workers, then HL1); the JSON records which cells ran.
``--quick`` (2 workers, HL4, one seed, 2 short epochs) writes ``asp_accuracy_quick.json``. ``--merge A.json B.json``
recomputes the table (and plot) from the runs of earlier result files into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader

from benchmarks.harness.grid import Cell, scaled
from benchmarks.harness.launch import ROOT as ROOT_DIR
from benchmarks.harness.launch import run_job, scenario_command
from benchmarks.harness.models import TrainingTimes, classification_split, quiet_trainer
from benchmarks.harness.record import write_json
from lightning_hetero import AsyncPSStrategy, SlowdownEmulator, SyncSwitchCallback
from lightning_hetero.asp.compensation import AsynchronyCompensator
from lightning_hetero.switching import FixedFractionPolicy, SchedulePolicy
from lightning_hetero.switching.policies import share_in_epochs
from lightning_hetero.synthetic import MLPClassifier

ROOT = ROOT_DIR
RESULTS = ROOT / "benchmarks" / "results"
CONFIGS = ("bsp", "asp_none", "asp", "hybrid", "asp_dc", "hybrid_none", "reverse", "asp_textbook")


def slowdown_factors(workers: int, hl: float) -> list[float]:
    """Per-rank slowdowns from 1 (rank 0) to ``hl`` (the last rank), geometrically spaced.

    Example::

        >>> slowdown_factors(2, 4.0), [round(f, 2) for f in slowdown_factors(3, 4.0)], slowdown_factors(2, 1.0)
        ([1.0, 4.0], [1.0, 2.0, 4.0], [1.0, 1.0])
    """
    if workers == 1:
        return [1.0]
    return [hl ** (rank / (workers - 1)) for rank in range(workers)]


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value).

    Example::

        >>> mean_sd([1.0, 3.0]), mean_sd([2.0])
        ((2.0, 1.4142135623730951), (2.0, 0.0))
    """
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


class SleepMLP(MLPClassifier):
    """The synthetic MLP whose training step also sleeps ``cost_s`` per sample (emulated compute)."""

    def __init__(self, cost_s: float, lr: float, momentum: float) -> None:
        super().__init__(lr=lr, momentum=momentum)
        self.cost_s = cost_s
        self.emulated_cpu_s = 0.0  # the sleeps, charged to a CPU quota (``--throttle cfs``) as compute

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(self.cost_s * x.shape[0])
        self.emulated_cpu_s += self.cost_s * x.shape[0]
        return nn.functional.cross_entropy(self(x), y)


class EpochRecorder(TrainingTimes):
    """Rank 0, per epoch: mode, training seconds (validation excluded), validation accuracy, hyper-parameters."""

    def __init__(self) -> None:
        super().__init__(start_together=True)

    def extra(self, trainer: L.Trainer, mode: str) -> dict[str, Any]:
        metrics = trainer.callback_metrics

        def get(key: str) -> float | None:
            return float(metrics[key]) if key in metrics else None

        return {
            "momentum_effective": get("ps/momentum_effective"),
            "lr_effective": get("ps/lr_effective"),
            "staleness": get("ps/staleness") if mode == "asp" else None,
        }


def run_one(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    L.seed_everything(args.seed, verbose=False)
    train, val = classification_split(args.samples, args.val_samples, args.seed, args.noise)
    factors = slowdown_factors(args.n, args.level)
    recorder = EpochRecorder()
    callbacks: list[Callback] = [recorder]
    slowed = {rank: factor for rank, factor in enumerate(factors) if factor > 1.0}
    model = SleepMLP(args.cost_s, args.lr, args.momentum)
    if slowed:
        callbacks.append(
            SlowdownEmulator(
                factors=slowed,
                throttle=args.throttle,
                cpu_clock=lambda: time.process_time() + model.emulated_cpu_s,
            )
        )
    compensation = None if args.config.endswith("_none") else ("dc" if args.config == "asp_dc" else "auto")
    hybrid = args.config.startswith("hybrid")
    mode = "bsp" if args.config == "bsp" or hybrid else "asp"
    switch = None
    if hybrid:
        switch = SyncSwitchCallback(FixedFractionPolicy(args.bsp_fraction), verbose=False)
    elif args.config == "reverse":
        asp_epochs = args.epochs - share_in_epochs(args.bsp_fraction, args.epochs)
        switch = SyncSwitchCallback(SchedulePolicy(f"asp:0-{asp_epochs - 1},bsp:{asp_epochs}-"), verbose=False)
    if switch is not None:
        callbacks.insert(0, switch)
    strategy = AsyncPSStrategy(
        mode=mode,
        asynchrony_compensation=compensation,
        fault_timeout_s=300,
        overlap_round_trip=args.config != "asp_textbook",
    )
    trainer = quiet_trainer(
        devices=args.n,
        strategy=strategy,
        max_epochs=args.epochs,
        callbacks=callbacks,
        num_sanity_val_steps=0,
    )
    trainer.fit(
        model,
        train_dataloaders=DataLoader(train, batch_size=args.batch_size, shuffle=True),
        val_dataloaders=DataLoader(val, batch_size=1024),
    )
    if trainer.is_global_zero:
        result = {
            "epochs": recorder.epochs,
            "server_summary": strategy.server_summary,
            "switches": switch.switches if switch else [],
            "factors": factors,
        }
        Path(args.out).write_text(json.dumps(result, default=str))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def launch(args: argparse.Namespace, config: str, workers: int, level: float, seed: int) -> dict[str, Any]:
    out = RESULTS / f".asp_accuracy_{os.getpid()}.json"
    command = [
        *scenario_command("asp_accuracy"), "--run", config, "--n", str(workers), "--level", str(level), "--seed", str(seed),
        "--out", str(out), "--epochs", str(args.epochs), "--samples", str(args.samples),
        "--val-samples", str(args.val_samples), "--noise", str(args.noise), "--cost-s", str(args.cost_s),
        "--lr", str(args.lr), "--momentum", str(args.momentum), "--batch-size", str(args.batch_size),
        "--bsp-fraction", str(args.bsp_fraction), "--throttle", args.throttle,
    ]  # fmt: skip
    load_before, started = os.getloadavg()[0], time.perf_counter()
    run_job(command)
    result = json.loads(out.read_text())
    out.unlink()
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
        "asp_momentum_effective_mean": (
            statistics.fmean(e["momentum_effective"] for e in asp_epochs if e["momentum_effective"] is not None)
            if any(e["momentum_effective"] is not None for e in asp_epochs)
            else None
        ),
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
    cells: dict[tuple, list[dict[str, Any]]] = {}
    bsp_by_seed: dict[tuple, dict[str, Any]] = {}
    for run in runs:
        cells.setdefault((run["workers"], run["hl"], run["config"]), []).append(run)
        if run["config"] == "bsp":
            bsp_by_seed[(run["workers"], run["hl"], run["seed"])] = run
    rows = []
    for (workers, level, config), group in cells.items():
        acc = mean_sd([r["final_acc"] for r in group])
        train_s = mean_sd([r["train_s"] for r in group])
        staleness = [r["staleness_mean"] for r in group if r["staleness_mean"] is not None]
        momenta = [r["asp_momentum_effective_mean"] for r in group if r["asp_momentum_effective_mean"] is not None]
        paired = [(r, bsp_by_seed.get((workers, level, r["seed"]))) for r in group]
        paired = [(r, b) for r, b in paired if b is not None]
        diff = mean_sd([100 * (r["final_acc"] - b["final_acc"]) for r, b in paired]) if paired else (None, None)
        ratio = mean_sd([r["train_s"] / b["train_s"] for r, b in paired]) if paired else (None, None)
        rows.append(
            {
                "workers": workers,
                "hl": level,
                "config": config,
                "seeds": [r["seed"] for r in group],
                "acc_mean": acc[0],
                "acc_sd": acc[1],
                "train_s_mean": train_s[0],
                "train_s_sd": train_s[1],
                "acc_vs_bsp_points": diff[0],
                "acc_vs_bsp_points_sd": diff[1],
                "time_vs_bsp": ratio[0],
                "time_vs_bsp_sd": ratio[1],
                "staleness_mean": statistics.fmean(staleness) if staleness else None,
                "staleness_max": max(
                    (r["staleness_max"] for r in group if r["staleness_max"] is not None), default=None
                ),
                "asp_momentum_effective": statistics.fmean(momenta) if momenta else None,
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'N':>2} {'HL':>3} {'config':>11} {'seeds':>5} {'acc mean+-sd':>15} {'vs BSP pt (paired)':>18} "
        f"{'train s':>8} {'vs BSP':>6} {'stal mean/max':>13} {'mom. in ASP':>11}"
    )
    print(header)
    for row in rows:
        vs = (
            "-"
            if row["acc_vs_bsp_points"] is None
            else f"{row['acc_vs_bsp_points']:+.2f}+-{row['acc_vs_bsp_points_sd']:.2f}"
        )
        time_vs = "-" if row["time_vs_bsp"] is None else f"{row['time_vs_bsp']:.2f}x"
        stale = "-" if row["staleness_mean"] is None else f"{row['staleness_mean']:.2f}/{row['staleness_max']}"
        momentum = "-" if row["asp_momentum_effective"] is None else f"{row['asp_momentum_effective']:.3f}"
        print(
            f"{row['workers']:>2} {row['hl']:>3g} {row['config']:>11} {len(row['seeds']):>5} "
            f"{row['acc_mean']:>8.4f}+-{row['acc_sd']:.4f} {vs:>18} {row['train_s_mean']:>8.1f} {time_vs:>6} "
            f"{stale:>13} {momentum:>11}"
        )


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    levels = sorted({row["hl"] for row in rows})
    figure, axes = plt.subplots(1, len(levels), figsize=(5 * len(levels), 4), squeeze=False)
    for axis, level in zip(axes[0], levels, strict=True):
        for config in CONFIGS[1:]:
            points = sorted(
                (r["workers"], r["acc_vs_bsp_points"], r["acc_vs_bsp_points_sd"])
                for r in rows
                if r["hl"] == level and r["config"] == config and r["acc_vs_bsp_points"] is not None
            )
            if points:
                xs, ys, sds = zip(*points, strict=True)
                axis.errorbar(xs, ys, yerr=sds, marker="o", capsize=3, label=config)
        axis.axhline(0.0, color="black", linewidth=0.8)
        axis.set_xticks(sorted({r["workers"] for r in rows}))
        axis.set(title=f"HL{level:g}", xlabel="workers", ylabel="final accuracy - BSP's (points, paired by seed)")
        axis.legend()
    figure.tight_layout()
    figure.savefig(path)
    return True


def merge(paths: list[Path], out: Path) -> None:
    """One report from several result files: their runs, conditions and cell lists, the table recomputed."""
    reports = [json.loads(path.read_text()) for path in paths]
    runs = [run for report in reports for run in report["runs"]]
    ran = {(run["workers"], run["hl"], run["seed"]) for run in runs}
    skipped = [cell for report in reports for cell in report["cells_skipped_for_budget"]]
    rows = summarise(runs)
    print_table(rows)
    merged = {
        "merged_from": [str(path) for path in paths],
        "conditions": [report["conditions"] for report in reports],
        "cells_ran": [cell for report in reports for cell in report["cells_ran"]],
        "cells_skipped_for_budget": [
            cell for cell in skipped if (cell["workers"], cell["hl"], cell["seed"]) not in ran
        ],
        "compensation_cost_us_per_update": reports[-1]["compensation_cost_us_per_update"],
        "median_asp_update_interval_us": reports[-1]["median_asp_update_interval_us"],
        "rows": rows,
        "runs": runs,
    }
    write_json(out, merged)
    print(f"wrote {out}")
    if plot(rows, out.with_suffix(".png")):
        print(f"wrote {out.with_suffix('.png')}")


def cell_order(workers: list[int], levels: list[float]) -> list[tuple[int, float]]:
    """2 and 4 workers at the highest HL first, then more workers, then the lower HLs.

    Example::

        >>> cell_order([2, 4, 8], [1.0, 4.0])
        [(2, 4.0), (4, 4.0), (8, 4.0), (2, 1.0), (4, 1.0), (8, 1.0)]
    """
    return [(n, level) for level in sorted(levels, reverse=True) for n in sorted(workers)]


def default_out(args: argparse.Namespace) -> Path:
    return RESULTS / ("asp_accuracy_quick.json" if args.quick else "asp_accuracy.json")


def grid_axes(args: argparse.Namespace) -> dict[str, list[Cell] | str]:
    """From the command line's cells, one condition varied at a time."""
    other = "cfs" if args.throttle == "sleep" else "sleep"
    return {
        "emulation": [Cell("emulation", other, {"throttle": other})],
        "cost": [Cell("cost", f"x{k:g}", {"cost_s": args.cost_s * k}) for k in (0.5, 2)],
        "epoch": [Cell("epoch", f"x{k:g}", {"samples": round(args.samples * k)}) for k in (0.25, 4)],
        "workers": [Cell("workers", "x2", {"workers": scaled(args.workers, 2)})],
        "quota": [Cell("quota", f"HL x{k:g}", {"throttle": "cfs", "hl": scaled(args.hl, k)}) for k in (0.5, 2)],
    }


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
    parser.add_argument("--quick", action="store_true", help="2 workers, HL4, seed 0, 2 epochs of 2048 samples")
    parser.add_argument("--workers", default="2,4,8")
    parser.add_argument("--hl", default="4,1")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--configs", default="bsp,asp_none,asp,hybrid")
    parser.add_argument("--budget-s", type=float, default=3000.0, help="start no new cell after this many seconds")
    parser.add_argument("--out", type=Path, default=None, help="default: results/asp_accuracy[_quick].json")
    parser.add_argument("--merge", type=Path, nargs="+", help="recompute the table from these result files")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--val-samples", type=int, default=2048)
    parser.add_argument("--noise", type=float, default=4.0)
    parser.add_argument("--cost-s", type=float, default=0.0008, help="emulated compute seconds per sample")
    parser.add_argument(
        "--throttle",
        choices=["sleep", "cfs"],
        default="sleep",
        help="how SlowdownEmulator slows a rank: a sleep, or a CPU quota of 1/factor per 100 ms (the emulated "
        "compute's sleeps count as CPU time)",
    )
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--bsp-fraction", type=float, default=0.25)
    parser.add_argument("--run", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--level", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> None:
    if args.run is not None:
        args.config = args.run
        run_one(args)
        return
    if args.out is None:
        args.out = RESULTS / ("asp_accuracy_quick.json" if args.quick else "asp_accuracy.json")
    if args.merge:
        merge(args.merge, args.out)
        return
    if args.quick:
        args.workers, args.hl, args.seeds, args.epochs, args.samples = "2", "4", "0", 2, 2048
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        raise SystemExit(f"error: unknown configs {unknown}; choose from {', '.join(CONFIGS)}")
    workers = [int(n) for n in args.workers.split(",")]
    levels = [float(h) for h in args.hl.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    RESULTS.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    ran: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for n, level in cell_order(workers, levels):
        for seed in seeds:
            if time.perf_counter() - started > args.budget_s:
                skipped.append({"workers": n, "hl": level, "seed": seed})
                continue
            for config in configs:
                run = launch(args, config, n, level, seed)
                runs.append(run)
                print(
                    f"N={n} HL{level:g} seed {seed} {config:>11}: acc {run['final_acc']:.4f} "
                    f"({' '.join(f'{a:.3f}' for a in run['acc_per_epoch'])}, {run['modes']}) "
                    f"train {run['train_s']:.1f} s, staleness {run['staleness_mean']}",
                    flush=True,
                )
            ran.append({"workers": n, "hl": level, "seed": seed, "configs": configs})
    rows = summarise(runs)
    print_table(rows)
    cost_us = compensation_cost_us()
    asp_steps = [r["train_s"] / r["updates"] * 1e6 for r in runs if r["config"] == "asp" and r["updates"]]
    step_us = statistics.median(asp_steps) if asp_steps else None
    share = None if step_us is None else cost_us / step_us
    print(
        f"compensation cost: {cost_us:.1f} us per update"
        + ("" if share is None else f" ({share:.3%} of the median ASP update interval)")
    )
    report = {
        "conditions": {
            **{k: v for k, v in vars(args).items() if k not in ("run", "n", "level", "seed", "config", "out")},
            "model": "MLPClassifier 32-64-4 (tanh), SGD",
            "emulation": "training step sleeps cost_s per sample; SlowdownEmulator slows rank k by HL**(k/(N-1))"
            + (
                " as a CPU quota (throttle='cfs', 100 ms periods; the sleeps count as CPU)"
                if args.throttle == "cfs"
                else ""
            ),
            "host": f"{os.cpu_count()} CPUs shared with other jobs",
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "wall_s": time.perf_counter() - started,
        },
        "cells_ran": ran,
        "cells_skipped_for_budget": skipped,
        "compensation_cost_us_per_update": cost_us,
        "median_asp_update_interval_us": step_us,
        "rows": rows,
        "runs": runs,
    }
    write_json(args.out, report)
    print(f"wrote {args.out}")
    png = args.out.with_suffix(".png")
    if plot(rows, png):
        print(f"wrote {png}")
    else:
        print("matplotlib not installed: no plot")
