"""Local SGD (``AsyncPSStrategy(mode="local")``) against DDP on emulated heterogeneous workers.

Each of ``CONFIGS`` on N processes, rank k slowed ``HL ** (k / (N - 1))``: samples/s against the standalone bound
(N single processes side by side), bytes per sample, and accuracy and time to accuracy against the seed's DDP run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.harness import models
from benchmarks.harness.grid import Cell, workers_hl_axes
from benchmarks.harness.launch import RESULTS, child_env, run_job, run_jobs
from benchmarks.harness.models import MLP, StartTogether, chosen, classification_split, fit, quiet_trainer
from benchmarks.harness.record import table, write_json
from benchmarks.harness.stats import median, seed_paired, time_to_target, within_budget
from benchmarks.scenarios.local_sgd_breakdown import BreakdownRecorder, collect, format_breakdown
from lightning_hetero import AsyncPSStrategy, SlowdownEmulator
from lightning_hetero.async_ps import PSAdvanced

CONFIGS = ("ddp", "local_equal", "local_prop", "local_prop_samples")
MODELS = ("light", "heavy")
#: the model's input and hidden widths, the batch per rank, the validation samples and local steps per round
FEATURES, HIDDEN, BATCH, VAL_SAMPLES, ROUND_STEPS = 32, 512, 32, 2048, 16
#: DDP: steps between the parameter copies timed for accuracy
CURVE_STEPS = 4
#: what a local-SGD run records of its rounds (``None`` for DDP)
LOCAL_KEYS = ("local_bytes_sent_rank0", "local_rounds", "local_plans_last", "local_rates_last", "local_plans")


def curve_times(epochs: list[dict[str, Any]], snapshots: list[tuple[int, float]]) -> list[float]:
    """Training seconds at which each ``(epoch, wall time)`` snapshot was taken: the earlier epochs' training time plus
    the time since its epoch's start (``epochs[i]["start"]``: the first rank's, in wall time), so that validation
    between epochs does not count."""
    before = [sum(e["train_s"] for e in epochs[:i]) for i in range(len(epochs))]
    return [before[epoch] + wall - epochs[epoch]["start"] for epoch, wall in snapshots]


class EpochRecorder(Callback):
    """Per epoch: training seconds from the first rank's start to the last rank's end of training (the first
    validation batch, so that an epoch-end meeting counts as training: ranks that are not in lock-step start and end
    at different times), validation accuracy and samples trained over all ranks; rank 0 keeps the records. Also
    ``train_s_before_val_fetch``: the same span ended at the validation epoch's start, after the strategy's
    ``on_validation_start`` (the epoch-end meeting) and before the first validation batch is fetched (validation
    work, which the standalone bound, run without validation, never does)."""

    def __init__(self, samples_per_epoch: int) -> None:
        self.samples_per_epoch = samples_per_epoch
        self.epochs: list[dict[str, Any]] = []
        self._start, self._train_end, self._val_epoch_start = 0.0, None, None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        trainer.strategy.barrier()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start, self._train_end, self._val_epoch_start = time.time(), None, None

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._val_epoch_start is None and trainer.state.fn == "fit":
            self._val_epoch_start = time.time()

    def on_validation_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self._train_end is None and trainer.state.fn == "fit":
            self._train_end = time.time()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        end = self._train_end if self._train_end is not None else time.time()
        val_start = self._val_epoch_start if self._val_epoch_start is not None else end
        times = trainer.strategy.all_gather(torch.tensor([self._start, end, val_start], dtype=torch.float64))
        starts, ends, val_starts = times.reshape(-1, 3).T.tolist()
        first, acc = min(starts), trainer.callback_metrics.get("val_acc")
        self.epochs.append(
            {
                "epoch": trainer.current_epoch,
                "start": first,
                "train_s": max(ends) - first,
                "train_s_before_val_fetch": max(val_starts) - first,
                "val_acc": None if acc is None else float(acc),
                "samples": self.samples_per_epoch,
            }
        )


class CurveRecorder(Callback):
    """Rank 0 keeps copies of the parameters that every rank holds, with the epoch and wall time: in local SGD after
    each round end (the combined parameters), with DDP every ``every`` steps and at each epoch's last step (identical
    on every rank). Evaluated after training, untimed (:func:`evaluate_curve`)."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.snapshots: list[tuple[int, float, torch.Tensor]] = []
        self._rounds = self._steps = 0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *_: Any):
        if not trainer.is_global_zero:
            return
        self._steps += 1
        strategy = trainer.strategy
        if isinstance(strategy, AsyncPSStrategy):  # local SGD: after a round end
            if strategy.local_rounds is None or strategy.local_rounds.rounds == self._rounds:
                return
            self._rounds = strategy.local_rounds.rounds
        elif self._steps % self.every and not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            return
        flat = torch.nn.utils.parameters_to_vector(pl_module.parameters()).detach().clone()
        self.snapshots.append((trainer.current_epoch, time.time(), flat))


@torch.no_grad()
def evaluate_curve(model: L.LightningModule, snapshots: list[torch.Tensor], val: TensorDataset) -> list[float]:
    """Validation accuracy of each flat parameter snapshot (loaded into ``model``)."""
    x, y = val.tensors
    accs = []
    for flat in snapshots:
        torch.nn.utils.vector_to_parameters(flat, model.parameters())
        accs.append(float((model(x).argmax(-1) == y).float().mean()))
    return accs


class StandaloneMeter(Callback):
    """Samples per second of a single process after ``warmup`` batches."""

    def __init__(self, warmup: int = 10) -> None:
        self.warmup, self.batches, self.samples = warmup, 0, 0
        self.start: float | None = None
        self.end = 0.0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *_: Any):
        self.batches += 1
        if self.batches == self.warmup:
            self.start = time.perf_counter()
        elif self.batches > self.warmup:
            self.samples += len(batch[0])
            self.end = time.perf_counter()


def run_one(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    L.seed_everything(args.seed, verbose=False)
    train, val = classification_split(args.samples, VAL_SAMPLES, args.seed, args.noise, FEATURES, args.classes)
    factors = models.slowdown_factors(args.n, args.level)
    slowed = {rank: factor for rank, factor in enumerate(factors) if factor > 1.0}
    cost_s = args.heavy_cost_s if args.model == "heavy" else 0.0
    model = MLP(FEATURES, args.classes, [HIDDEN] * 2, args.lr, args.momentum, cost_s, nn.Tanh)
    if args.config == "standalone":
        meter = StandaloneMeter()
        slow = [SlowdownEmulator(factors={0: args.level}, throttle=args.throttle)] if args.level > 1.0 else []
        callbacks = [meter, StartTogether(args.barrier, args.barrier_n), *slow]
        trainer = quiet_trainer(devices=1, max_time={"seconds": args.standalone_s}, max_epochs=-1, callbacks=callbacks,
                                limit_val_batches=0)  # fmt: skip
        trainer.fit(model, DataLoader(train, batch_size=BATCH, shuffle=True))
        rate = meter.samples / (meter.end - meter.start) if meter.start is not None and meter.end > meter.start else 0
        Path(args.out).write_text(json.dumps({"samples_per_s": rate, "batches": meter.batches}))
        return
    recorder, curve = EpochRecorder(args.samples), CurveRecorder(CURVE_STEPS)
    callbacks: list[Callback] = [recorder, curve]
    if slowed:
        callbacks.append(SlowdownEmulator(factors=slowed, throttle=args.throttle))
    if args.config == "ddp":
        strategy: Any = DDPStrategy(process_group_backend="gloo")
    else:
        outer = {"lr": args.outer_lr, "momentum": args.outer_momentum, "nesterov": args.outer_momentum > 0}
        strategy = AsyncPSStrategy(
            mode="local",
            round_length=ROUND_STEPS,  # local steps per rank on average
            advanced=PSAdvanced(
                local_steps="equal" if args.config == "local_equal" else "proportional",
                pseudo_gradient_weighting="samples" if args.config == "local_prop_samples" else "mean",
            ),
            outer_optimizer=torch.optim.SGD,
            outer_optimizer_kwargs=outer,
            fault_timeout_s=300,
        )
        if args.breakdown:
            callbacks.append(BreakdownRecorder(str(args.out)))
    trainer = quiet_trainer(devices=args.n, strategy=strategy, max_epochs=args.epochs, callbacks=callbacks,
                            num_sanity_val_steps=0)  # fmt: skip
    params = sum(p.numel() for p in model.parameters())
    fit(trainer, model, train, val, BATCH)
    result = None
    if trainer.is_global_zero:
        rounds = getattr(strategy, "local_rounds", None)
        times = curve_times(recorder.epochs, [(epoch, wall) for epoch, wall, _ in curve.snapshots])
        accs = evaluate_curve(model, [flat for *_, flat in curve.snapshots], val)
        result = {
            "epochs": recorder.epochs,
            "curve": list(zip(times, accs, strict=True)),
            "params": params,
            "factors": factors,
        } | dict.fromkeys(LOCAL_KEYS)
        if rounds is not None:
            result |= {
                "local_bytes_sent_rank0": rounds.bytes_sent,
                "local_rounds": rounds.rounds,
                "local_plans_last": rounds.plans[-3:],
                "local_rates_last": rounds.rates,
                "local_plans": rounds.plans if args.breakdown else None,
            }
    models.finish(trainer, args.out, result)


#: the settings a run's child process is given
CHILD_FLAGS = ("epochs", "samples", "noise", "lr", "momentum", "heavy_cost_s", "standalone_s", "outer_lr",
               "outer_momentum", "barrier", "barrier_n", "classes", "throttle", "breakdown")  # fmt: skip


def child_command(args: argparse.Namespace, config: str, model: str, n: int, level: float, seed: int, out: Path):
    return models.child_command(
        "local_sgd", args, CHILD_FLAGS, run=config, model=model, n=n, level=level, seed=seed, out=out
    )


def standalone_bound(args: argparse.Namespace, model: str, n: int, level: float) -> list[float]:
    """Each rank's standalone samples/s, measured by N single processes side by side."""
    with tempfile.TemporaryDirectory(prefix="local-sgd-standalone-") as tmp:
        outs = [Path(tmp, f"{rank}.json") for rank in range(n)]
        args.barrier, args.barrier_n = tmp, n  # the jobs start training together (imports take seconds of CPU)
        commands = [
            child_command(args, "standalone", model, 1, factor, 0, out)
            for factor, out in zip(models.slowdown_factors(n, level), outs, strict=True)
        ]
        run_jobs(commands, 600, child_env(OMP_NUM_THREADS="1"))
        return [json.loads(out.read_text())["samples_per_s"] for out in outs]


def launch(args: argparse.Namespace, config: str, model: str, n: int, level: float, seed: int) -> dict[str, Any]:
    out = RESULTS / f".local_sgd_{os.getpid()}.json"
    started = time.perf_counter()
    run_job(child_command(args, config, model, n, level, seed, out), env=child_env(OMP_NUM_THREADS="1"))
    result = json.loads(out.read_text())
    out.unlink()
    timeline = collect(str(out), n) if args.breakdown and config.startswith("local") else None
    epochs = result["epochs"]
    measured = epochs[1:] if len(epochs) > 1 else epochs
    samples = sum(e["samples"] for e in measured)
    throughput = samples / sum(e["train_s"] for e in measured)
    before_val_fetch = [e.get("train_s_before_val_fetch") for e in measured]
    throughput_before_val_fetch = samples / sum(before_val_fetch) if None not in before_val_fetch else None
    params = result["params"]
    rates = result.get("local_rates_last") or [None]
    busy_bound = sum(rates) if all(r is not None for r in rates) else None
    sent = result["local_bytes_sent_rank0"]  # every rank sends one per round; DDP all-reduces float32 gradients
    bytes_per_sample = 4 * params / BATCH if sent is None else sent * n / sum(e["samples"] for e in epochs)
    return {
        "config": config, "model": model, "workers": n, "hl": level, "seed": seed, "final_acc": epochs[-1]["val_acc"],
        "acc_per_epoch": [e["val_acc"] for e in epochs], "curve": result["curve"],
        "train_s_per_epoch": [e["train_s"] for e in epochs], "epochs": epochs, "throughput": throughput,
        "throughput_before_val_fetch": throughput_before_val_fetch, "bytes_per_sample": bytes_per_sample,
        "params": params,
        **{key: result[key] for key in LOCAL_KEYS[1:]},
        # each rank's busy rate in the run (samples/s of its local steps, waits excluded): a bound measured side by
        # side with the run itself, under the same host load
        "local_busy_bound": busy_bound,
        "of_local_busy_bound": throughput / busy_bound if busy_bound else None,
        "breakdown": timeline,
        "wall_s": time.perf_counter() - started, "load_1min_after": os.getloadavg()[0],
    }  # fmt: skip


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians over seeds per (model, workers, HL, config): throughput and its ratio to the standalone bound measured
    next to the run; accuracy and time-to-accuracy against the seed's ddp run."""
    rows = []
    for (model, workers, level, config), group, paired in seed_paired(runs, ["model", "workers", "hl"], "ddp"):
        diffs = [100 * (run["final_acc"] - ddp["final_acc"]) for run, ddp in paired]
        times = [time_to_target(run["epochs"], ddp["final_acc"] - 0.005, run.get("curve")) for run, ddp in paired]
        throughput = statistics.median(r["throughput"] for r in group)
        rows.append({
            "model": model, "workers": workers, "hl": level, "config": config, "seeds": [r["seed"] for r in group],
            "throughput": throughput, "of_standalone_bound": statistics.median(r["of_standalone_bound"] for r in group),
            "of_local_busy_bound": median([r.get("of_local_busy_bound") for r in group]),
            "bytes_per_sample": statistics.median(r["bytes_per_sample"] for r in group),
            "acc": statistics.median(r["final_acc"] for r in group),
            "acc_vs_ddp_points": median(diffs), "acc_vs_ddp_points_all": diffs,
            "time_to_ddp_acc_s": median(times), "time_to_ddp_acc_all": times,
            "reached_ddp_acc": sum(t is not None for t in times),
        })  # fmt: skip
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    header = ["model", "N", "HL", "config", "seeds", "samples/s", "of bound", "of busy", "B/sample", "acc", "vs ddp pt",
              "t to ddp-0.5 (s)", "reached"]  # fmt: skip
    cells = [
        [r["model"], r["workers"], r["hl"], r["config"], len(r["seeds"]), r["throughput"], r["of_standalone_bound"],
         r["of_local_busy_bound"], r["bytes_per_sample"], r["acc"], r["acc_vs_ddp_points"], r["time_to_ddp_acc_s"],
         f"{r['reached_ddp_acc']}/{len(r['seeds'])}"]
        for r in rows
    ]  # fmt: skip
    print(table(header, cells, ["", "", "g", "", "", ".0f", ".2f", ".2f", ".0f", ".4f", "+.2f", ".1f"]))


def default_out(args: argparse.Namespace) -> Path:
    return RESULTS / ("local_sgd_quick.json" if args.quick else "local_sgd.json")


def grid_axes(args: argparse.Namespace) -> dict[str, list[Cell] | str]:
    axes = workers_hl_axes(args, "heavy_cost_s")
    if "heavy" not in args.models:
        axes["cost"] = "the light model has no emulated per-sample cost (--models heavy has)"
    return axes


def figures(payload: dict) -> dict[str, float]:
    """Per row (by position) and configuration: throughput over the summed standalone bound, and accuracy against
    DDP in points."""
    found = {}
    for i, row in enumerate(payload["rows"]):
        found[f"row {i} {row['config']}: of ideal"] = row["of_standalone_bound"]
        if row["config"] != "ddp" and row["acc_vs_ddp_points"] is not None:
            found[f"row {i} {row['config']}: accuracy vs DDP, points"] = row["acc_vs_ddp_points"]
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="2 workers, HL4, light, seed 0, 2 epochs")
    models.add_study_flags(parser, (*CONFIGS, "standalone"), ",".join(CONFIGS), workers="4", hl="4,8", budget_s=1800.0)
    parser.add_argument("--models", default="light")
    parser.add_argument("--out", type=Path, default=None, help="default: results/local_sgd[_quick].json")
    parser.add_argument("--classes", type=int, default=4, help="classes of the synthetic task (the model's outputs)")
    parser.add_argument("--breakdown", action="store_true", help="local SGD: time per rank and category")
    parser.add_argument("--heavy-cost-s", type=float, default=0.001, help="emulated compute s/sample (heavy)")
    parser.add_argument("--standalone-s", type=float, default=8.0)
    parser.add_argument(
        "--outer-lr", type=float, default=1.0, help="local SGD's outer SGD learning rate (1 and momentum 0: averaging)"
    )
    parser.add_argument("--outer-momentum", type=float, default=0.0, help="Nesterov momentum (DiLoCo: lr 0.7, 0.9)")
    parser.add_argument("--barrier", default="", help=argparse.SUPPRESS)
    parser.add_argument("--barrier-n", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=MODELS, default="light", help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> None:
    if args.run is not None:
        args.config = args.run
        run_one(args)
        return
    if args.quick:
        args.workers, args.hl, args.models, args.seeds, args.epochs = "2", "4", "light", "0", 2
        args.samples, args.standalone_s = 2048, 5.0
    args.out = args.out or default_out(args)
    configs = chosen(args.configs, CONFIGS)
    RESULTS.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    standalone: dict[str, list[list[float]]] = {}
    ran, skipped = [], []
    cells = [
        {"model": model, "workers": int(n), "hl": float(level)}
        for model in args.models.split(",")
        for level in args.hl.split(",")
        for n in args.workers.split(",")
    ]
    for cell in within_budget(cells, args.budget_s, skipped):
        model, n, level = cell.values()
        key = f"{model}/{n}/{level:g}"
        for seed in (int(s) for s in args.seeds.split(",")):
            # the bound is measured next to each seed's runs, so that both see about the same host load
            rates = standalone_bound(args, model, n, level)
            standalone.setdefault(key, []).append(rates)
            bound = sum(rates)
            print(f"{key} seed {seed}: standalone {[round(r) for r in rates]} sum {bound:.0f}", flush=True)
            for config in configs:  # interleaved per seed: side by side on the same host load
                run = launch(args, config, model, n, level, seed)
                run["standalone_bound"] = bound
                run["of_standalone_bound"] = run["throughput"] / bound
                if run["throughput_before_val_fetch"] is not None:
                    run["of_standalone_bound_before_val_fetch"] = run["throughput_before_val_fetch"] / bound
                runs.append(run)
                fetch = run.get("of_standalone_bound_before_val_fetch", 0)
                print(
                    f"  seed {seed} {config:>11}: {run['throughput']:.0f} samples/s ({run['of_standalone_bound']:.2f}"
                    f" of bound; {fetch:.2f} ended before the validation fetch), acc "
                    f"{' '.join(f'{a:.3f}' for a in run['acc_per_epoch'])}, {run['bytes_per_sample']:.0f} B/sample",
                    flush=True,
                )
                if run["breakdown"] is not None:
                    print(f"    time of {n} ranks: {format_breakdown(run['breakdown'], n)}", flush=True)
        ran.append(cell)
    rows = summarise(runs)
    print_table(rows)
    report = {"cells_ran": ran, "cells_skipped_for_budget": skipped, "standalone_samples_per_s": standalone}
    write_json(args.out, report | {"rows": rows, "runs": runs})
