"""BSP vs ASP vs the BSP-then-ASP hybrid (SyncSwitchCallback) on a generated task, rank 1 4x slower.
Also ``reverse`` and ``asp_hetero``; ``switch_cost`` times six switches of the CIFAR ResNet-20.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader

from benchmarks.harness.launch import RESULTS, ROOT, run_json, scenario_command
from benchmarks.harness.models import MLP, TrainingTimes, classification_split, finish, fit, quiet_trainer
from benchmarks.harness.record import table, write_json
from benchmarks.harness.stats import time_to_target
from lightning_hetero.async_ps import AsyncPSStrategy
from lightning_hetero.emulation.slowdown import SlowdownEmulator
from lightning_hetero.hetero_batch import HeteroBatchCallback
from lightning_hetero.switching import FixedFractionPolicy
from lightning_hetero.switching.callback import SyncSwitchCallback
from lightning_hetero.switching.policies import share_in_epochs

CONFIGS = ("bsp", "asp", "hybrid", "reverse", "asp_hetero")
ALL = (*CONFIGS, "switch_cost")
ALTERNATING = "bsp:0,asp:1,bsp:2,asp:3,bsp:4,asp:5,bsp:6-"
#: the task and recipe: samples, features, classes, noise, hidden width (4 layers), batch per rank, lr, momentum
SAMPLES, FEATURES, CLASSES, NOISE, HIDDEN, BATCH, LR, MOMENTUM = 8192, 64, 10, 3.0, 512, 64, 0.003, 0.9
#: rank 1's slowdown, and the hybrid's (and reverse's) BSP share of the epochs
SLOWDOWN, BSP_FRACTION = 4.0, 0.25

#: why ``--grid`` does not apply
NO_GRID = "its figures (accuracy and switch cost at fixed settings) come from one run per configuration; asp_accuracy has the grid"


def reverse_schedule(epochs: int, bsp_fraction: float) -> str:
    """ASP first, then BSP, with the hybrid's epoch counts: as many ASP epochs as ``FixedFractionPolicy`` gives the
    hybrid's ASP phase, then BSP for the rest."""
    asp_epochs = epochs - share_in_epochs(bsp_fraction, epochs)
    if asp_epochs <= 0:
        return "bsp:0-"
    if asp_epochs >= epochs:
        return "asp:0-"
    return f"asp:0-{asp_epochs - 1},bsp:{asp_epochs}-"


def parse_configs(text: str) -> list[str]:
    """The ``--configs`` list, in the order of :data:`ALL` (so BSP, the baseline, runs first)."""
    names = {name.strip() for name in text.split(",") if name.strip()}
    if names == {"all"}:
        return list(ALL)
    unknown = sorted(names - set(ALL))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown configs {unknown or text!r}; choose from {', '.join(ALL)} or all")
    return [name for name in ALL if name in names]


def measure_switch_cost(args: argparse.Namespace) -> None:
    """ResNet-20 on generated CIFAR-shaped images, switching mode every epoch; rank 0 writes the switch costs."""
    sys.path.insert(0, str(ROOT))  # the ResNet-20 lives in the examples package at the repository root
    from examples.image_classification.data import make_cifar_like
    from examples.image_classification.model import ImageClassifier

    dataset, _ = make_cifar_like(256)
    model = ImageClassifier(arch="resnet20", lr=0.05)
    switch = SyncSwitchCallback(ALTERNATING, verbose=False)
    trainer = quiet_trainer(
        devices=args.workers,
        strategy=AsyncPSStrategy(mode="bsp"),
        max_epochs=7,
        callbacks=[switch],
        limit_val_batches=0,
    )
    trainer.fit(model, train_dataloaders=DataLoader(dataset, batch_size=16, shuffle=True))
    parameters = sum(p.numel() for p in model.parameters())
    finish(trainer, args.out, {"parameters": parameters, "switches": switch.switches})


def run_config(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    if args.config == "switch_cost":
        measure_switch_cost(args)
        return
    train, val = classification_split(SAMPLES, SAMPLES // 2, 0, NOISE, FEATURES, CLASSES)
    # 4 hidden layers: enough compute per step that the emulated slowdown, not Lightning's overhead, sets the pace
    model = MLP(FEATURES, CLASSES, [HIDDEN] * 4, LR, MOMENTUM)
    recorder = TrainingTimes()
    callbacks: list[Callback] = [recorder, SlowdownEmulator(factors={1: SLOWDOWN})]
    switch = None
    hetero = None
    mode = "asp" if args.config in ("asp", "asp_hetero") else "bsp"
    if args.config == "hybrid":
        switch = SyncSwitchCallback(FixedFractionPolicy(BSP_FRACTION), verbose=False)
    elif args.config == "reverse":
        schedule = reverse_schedule(args.epochs, BSP_FRACTION)
        switch = SyncSwitchCallback(schedule, verbose=False)
        mode = schedule[:3]  # start in the first phase's mode, so that epoch 0 needs no switch
    if switch is not None:
        callbacks.insert(0, switch)  # before the recorder, so that the recorder sees the epoch's mode
    if args.config == "asp_hetero":
        hetero = HeteroBatchCallback(verbose=False)
        callbacks.append(hetero)
    strategy = AsyncPSStrategy(mode=mode)
    trainer = quiet_trainer(devices=args.workers, strategy=strategy, max_epochs=args.epochs, callbacks=callbacks)
    fit(trainer, model, train, val, BATCH)
    result = {"config": args.config, "epochs": recorder.epochs, "switches": switch.switches if switch else []}
    result["server_summary"] = strategy.server_summary
    if hetero is not None:
        result["final_split"] = list(hetero.batch_sizes or ())
        result["split_history"] = [
            {"epoch": e["epoch"], "from": e["from"], "to": e["to"], "costs_overhead_s_per_sample_s": e["costs"]}
            for e in hetero.history
        ]
    finish(trainer, args.out, result)


def launch(config: str) -> dict:
    """Run one configuration in a child process (Lightning's launcher starts its other ranks from it)."""
    argv = [*sys.argv[3:], "--config", config]  # the parent's own flags (python -m benchmarks run sync_switch ...)
    command = lambda out: [*scenario_command("sync_switch"), *argv, "--out", str(out)]  # noqa: E731
    load_before, started = os.getloadavg(), time.perf_counter()
    result = run_json(command, timeout_s=1800)
    result["wall_s"] = time.perf_counter() - started
    result["load_average_1_5_15min_before_and_after"] = [load_before, os.getloadavg()]
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=2, help="processes (2-4 on CPU)")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument(
        "--configs",
        type=parse_configs,
        default=list(ALL),
        help=f"comma-separated subset of {','.join(ALL)} (default: all)",
    )
    parser.add_argument("--tag", default="", help="suffix of the results file: sync_switch_<N>workers_<tag>.json")
    parser.add_argument("--config", choices=ALL, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> None:
    if args.config is not None:
        run_config(args)
        return

    RESULTS.mkdir(parents=True, exist_ok=True)
    runs = {config: launch(config) for config in args.configs}
    resnet = runs.pop("switch_cost", None)

    if "bsp" in runs:  # the target accuracy: BSP's final (else the best) minus 0.5 points
        target = runs["bsp"]["epochs"][-1]["val_acc"] - 0.005
    elif runs:
        target = max(run["epochs"][-1]["val_acc"] for run in runs.values()) - 0.005
    else:
        target = None
    rows = []
    for config, run in runs.items():
        epochs = run["epochs"]
        rows.append({
            "config": config, "final_acc": epochs[-1]["val_acc"], "best_acc": max(e["val_acc"] for e in epochs),
            "train_s": sum(e["train_s"] for e in epochs), "time_to_target_s": time_to_target(epochs, target),
            "modes": "".join("B" if e["mode"] == "bsp" else "A" for e in epochs),
            "switch_cost_s": [s["cost_s"] for s in run["switches"]], "final_split": run.get("final_split"),
            "load_average_1_5_15min_before_and_after": run["load_average_1_5_15min_before_and_after"],
        })  # fmt: skip
    if rows:
        target_text = "BSP's final - 0.5 pt" if "bsp" in runs else "best - 0.5 pt"
        print(f"target accuracy {target:.4f} ({target_text}); rank 1 {SLOWDOWN}x slower; {args.workers} workers")
        bsp_s = next((row["train_s"] for row in rows if row["config"] == "bsp"), None)
        cells = [[r["config"], r["final_acc"], r["train_s"], "never" if r["time_to_target_s"] is None else
                  f"{r['time_to_target_s']:.1f}", None if bsp_s is None else r["train_s"] / bsp_s, r["modes"]]
                 for r in rows]  # fmt: skip
        header = ["config", "final acc", "train s", "to target s", "vs BSP", "modes"]
        print(table(header, cells, ["", ".4f", ".1f", "", ".2f"]))
        for row in rows:
            for cost in row["switch_cost_s"]:
                print(f"{row['config']}: switch cost {cost * 1000:.1f} ms")
            if row["final_split"]:
                print(f"{row['config']}: final per-rank batch sizes {row['final_split']}")
    if resnet is not None:
        for direction in ("bsp", "asp"):
            costs = [s["cost_s"] * 1000 for s in resnet["switches"] if s["to"] == direction]
            print(
                f"ResNet-20 ({resnet['parameters'] / 1e6:.2f}M parameters), into {direction.upper()}: "
                f"{', '.join(f'{c:.1f}' for c in costs)} ms"
            )
    params = sum(p.numel() for p in MLP(FEATURES, CLASSES, [HIDDEN] * 4, 0.1, 0.0).parameters())
    schedule = reverse_schedule(args.epochs, BSP_FRACTION)
    report = {
        "conditions": {"target": target, "reverse_schedule": schedule, "parameters": params}, "rows": rows,
        "resnet20_switch_cost": resnet, "epochs": {config: run["epochs"] for config, run in runs.items()},
        "runs": {config: {key: value for key, value in run.items() if key not in ("epochs", "config")}
                 for config, run in runs.items()},
    }  # fmt: skip
    suffix = f"_{args.tag}" if args.tag else ""
    path = RESULTS / f"sync_switch_{args.workers}workers{suffix}.json"
    write_json(path, report)
