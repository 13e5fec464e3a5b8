"""Benchmark: asynchronous parameter-server training (``AsyncPSStrategy``) against DDP, side by side, on CPU.

One run measures, on generated classification data and a ~0.3M-parameter MLP (ResNet-20 sized):

1. each worker standing alone (1 process): full speed, and slowed 4x by ``SlowdownEmulator``;
2. ASP: the parameter server in rank 0 plus 2 workers, rank 1 slowed 4x;
3. DDP (gloo): the same 2 workers, rank 1 slowed 4x;
4. the parameter server's cost per update (applying the optimizer and copying the reply; then a full push/pull
   round trip over gloo between two processes), in microseconds per MB of parameters.

Aggregate throughput counts training samples per second over the epochs after the first (warm-up) epoch, from the
earliest epoch start to the latest last-batch end across ranks (validation excluded). Accuracy is the validation
accuracy after the same number of epochs. Prints a table and writes ``benchmarks/results/async_ps.json``.

Usage: python -m benchmarks run async_ps [--epochs 4] [--samples 8192]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader

from benchmarks.harness.launch import RESULTS as RESULTS_DIR
from benchmarks.harness.launch import free_port, read_reports, run_jobs, scenario_command
from benchmarks.harness.models import classification_split, quiet_trainer
from benchmarks.harness.record import write_json
from lightning_hetero.emulation.slowdown import SlowdownEmulator
from lightning_hetero.ps import AsyncPSStrategy
from lightning_hetero.ps.layout import FlatLayout
from lightning_hetero.ps.protocol import PushHeader, new_message, payload, push_and_pull, send_done, write_push_header
from lightning_hetero.ps.server import ParameterServer
from lightning_hetero.ps.server_loop import ServerLoop

RESULTS = RESULTS_DIR / "async_ps.json"
MLP_FEATURES, CONV_FEATURES, NUM_CLASSES, HIDDEN, CHANNELS, CONV_LAYERS, NOISE = 64, 32, 10, 512, 96, 10, 2.5
FEATURES = {"mlp": MLP_FEATURES, "conv": CONV_FEATURES}


class Residual(nn.Module):
    """``x + conv(relu(x))``: keeps a deep plain convolution stack trainable without normalisation layers."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(torch.relu(x))


class BenchModel(L.LightningModule):
    """Two ~0.3M-parameter classifiers, SGD with momentum 0.9.

    ``"mlp"`` (lr 0.05): 64-512-512-10, about 2 FLOPs per parameter per sample forward (compute-light:
    communication is a large share of a step, the worst case for a parameter server). ``"conv"`` (lr 0.01): ten
    residual 96-channel 1-D convolutions over the 32 input features seen as a sequence (0.31M parameters, ~18 MFLOPs
    per sample forward, i.e. ~60 FLOPs per parameter per sample; a CIFAR ResNet-20 has ~150).

    Args:
        kind: ``"mlp"`` or ``"conv"``.
    """

    def __init__(self, kind: str = "mlp") -> None:
        super().__init__()
        if kind == "mlp":
            self.lr = 0.05
            self.net = nn.Sequential(
                nn.Linear(MLP_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                nn.Linear(HIDDEN, NUM_CLASSES),
            )  # fmt: skip
        else:
            self.lr = 0.01
            self.net = nn.Sequential(
                nn.Unflatten(1, (1, CONV_FEATURES)), nn.Conv1d(1, CHANNELS, 3, padding=1),
                *[Residual(CHANNELS) for _ in range(CONV_LAYERS)],
                nn.ReLU(), nn.Flatten(), nn.Linear(CHANNELS * CONV_FEATURES, NUM_CLASSES),
            )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self(x).argmax(-1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class EpochWindows(Callback):
    """Per rank: wall-clock start of each epoch, end of its last training batch, and samples trained."""

    def __init__(self) -> None:
        self.windows: dict[int, dict[str, float]] = {}

    def on_train_epoch_start(self, trainer, pl_module):
        self.windows[trainer.current_epoch] = {"start": time.time(), "end": time.time(), "samples": 0}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        window = self.windows[trainer.current_epoch]
        window["end"] = time.time()
        window["samples"] += len(batch[1])


class AlternateModes(Callback):
    """Switches ASP -> BSP -> ASP ... at every epoch end and records how long each switch took."""

    def __init__(self) -> None:
        self.switches: list[dict[str, float | str]] = []

    def on_train_epoch_end(self, trainer, pl_module):
        strategy = trainer.strategy
        target = "bsp" if strategy.mode == "asp" else "asp"
        strategy.set_mode(target)
        self.switches.append({"to": target, "seconds": strategy.last_switch_s})


def train(args: argparse.Namespace) -> None:
    """One training job (re-run by Lightning's launcher for the other ranks); each rank writes a JSON report."""
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    val_samples = args.samples * 5 // 4 - args.samples
    train_set, val_set = classification_split(args.samples, val_samples, 0, NOISE, FEATURES[args.model], NUM_CLASSES)
    windows = EpochWindows()
    callbacks: list[Callback] = [windows]
    if args.slow_rank >= 0:
        callbacks.append(SlowdownEmulator(factors={args.slow_rank: args.factor}))
    switcher = AlternateModes()
    if args.alternate_modes:
        callbacks.append(switcher)
    if args.strategy == "asp":
        strategy = AsyncPSStrategy()
    elif args.strategy == "ddp":
        strategy = DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=120))
    else:
        strategy = "auto"
    trainer = quiet_trainer(
        devices=args.devices,
        strategy=strategy,
        max_epochs=args.epochs,
        callbacks=callbacks,
        num_sanity_val_steps=0,
    )
    trainer.fit(
        BenchModel(args.model),
        train_dataloaders=DataLoader(train_set, batch_size=args.batch_size, shuffle=True),
        val_dataloaders=DataLoader(val_set, batch_size=512),
    )
    report = {
        "windows": windows.windows,
        "val_acc": float(trainer.callback_metrics["val_acc"]),
        "global_step": trainer.global_step,
        "server_summary": getattr(trainer.strategy, "server_summary", None),
        "switches": switcher.switches,
    }
    Path(args.out, f"rank{trainer.global_rank}.json").write_text(json.dumps(report))
    if dist.is_initialized():
        dist.destroy_process_group()  # an undestroyed gloo group can abort the interpreter at exit


def _command(args: argparse.Namespace, out: str, model: str, strategy: str, devices: int, slow_rank: int,
             epochs: int, alternate_modes: bool = False) -> list[str]:  # fmt: skip
    command = [
        *scenario_command("async_ps"), "--role", "train", "--out", out, "--strategy", strategy, "--model", model,
        "--devices", str(devices), "--slow-rank", str(slow_rank), "--factor", str(args.factor),
        "--epochs", str(epochs), "--samples", str(args.samples), "--batch-size", str(args.batch_size),
    ]  # fmt: skip
    return [*command, "--alternate-modes"] if alternate_modes else command


def _summarise(reports: list[dict], epochs: int) -> dict:
    measured = [str(epoch) for epoch in range(1, epochs)]
    samples = sum(r["windows"][e]["samples"] for r in reports for e in measured)
    seconds = sum(
        max(r["windows"][e]["end"] for r in reports) - min(r["windows"][e]["start"] for r in reports) for e in measured
    )
    per_rank = [sum(r["windows"][e]["samples"] for e in measured) / seconds for r in reports]
    return {
        "throughput": samples / seconds,
        "per_rank_throughput": per_rank,
        "val_acc": reports[0]["val_acc"],
        "global_step": reports[0]["global_step"],
        "server_summary": reports[0]["server_summary"],
        "switches": reports[0]["switches"],
    }


def launch(args: argparse.Namespace, jobs: list[dict]) -> list[dict]:
    """Run jobs (each in fresh processes) at the same time and summarise each one's ranks' reports."""
    with tempfile.TemporaryDirectory() as tmp:
        outs = [str(Path(tmp, str(i))) for i in range(len(jobs))]
        for out in outs:
            Path(out).mkdir()
        run_jobs([_command(args, out, **job) for job, out in zip(jobs, outs, strict=True)], 1800)
        return [
            _summarise(read_reports(out, job["devices"]), job["epochs"]) for job, out in zip(jobs, outs, strict=True)
        ]


def _make_server(numel_hidden: int) -> tuple[ParameterServer, int]:
    model = nn.Sequential(nn.Linear(MLP_FEATURES, numel_hidden), nn.ReLU(), nn.Linear(numel_hidden, numel_hidden))
    layout = FlatLayout.from_named_parameters(model.named_parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    template = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    server = ParameterServer(layout, flat, template, {id(p): i for i, p in enumerate(model.parameters())}, 2)
    return server, layout.numel


def server_apply_cost(hidden: int, updates: int = 200) -> dict:
    """In-process: the server applying one pushed gradient and filling the reply."""
    torch.set_num_threads(1)
    server, numel = _make_server(hidden)
    grad, reply = torch.randn(numel), new_message(numel)
    header = PushHeader(0, 0, 0.5)
    for _ in range(10):
        server.apply(1, header._replace(base_version=server.version), grad.clone(), reply)
    start = time.perf_counter()
    for _ in range(updates):
        server.apply(1, header._replace(base_version=server.version), grad, reply)
    per_update_us = (time.perf_counter() - start) / updates * 1e6
    megabytes = numel * 4 / 1e6
    return {"params": numel, "mb": megabytes, "us_per_update": per_update_us, "us_per_mb": per_update_us / megabytes}


def _round_trip_worker(rank: int, port: int, hidden: int, updates: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    group = dist.new_group(backend="gloo")
    server, numel = _make_server(hidden)
    if rank == 0:
        loop = ServerLoop(server, [1], group, timedelta(seconds=60))
        loop.start()
        loop.join(600)
    else:
        push, reply = new_message(numel), new_message(numel)
        payload(push).normal_()
        timeout = timedelta(seconds=60)
        for i in range(updates + 10):
            if i == 10:
                start = time.perf_counter()
            write_push_header(push, 0, i, 0.5)
            push_and_pull(push, reply, 0, group, timeout)
        per_update_us = (time.perf_counter() - start) / updates * 1e6
        send_done(push, 0, group, timeout)
        Path(out).write_text(json.dumps({"us_per_update": per_update_us, "params": numel}))
    dist.destroy_process_group()


def round_trip_cost(hidden: int, updates: int = 200) -> dict:
    """Two processes over gloo: a worker's push, the server's update and the pull, as the worker sees it."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "rt.json")
        torch.multiprocessing.spawn(_round_trip_worker, args=(free_port(), hidden, updates, out), nprocs=2)
        result = json.loads(Path(out).read_text())
    megabytes = result["params"] * 4 / 1e6
    return {**result, "mb": megabytes, "us_per_mb": result["us_per_update"] / megabytes}


def suite(args: argparse.Namespace, model: str) -> dict:
    """The two workers standing alone, then ASP and DDP with the same two workers, for one model.

    The standalone workers run side by side (so they share the host as in the joint runs); the fast one runs
    ``4 * 2 + 1`` epochs so that it keeps running while the slowed one's two epochs do."""
    fast, slow = launch(
        args,
        [
            {"model": model, "strategy": "single", "devices": 1, "slow_rank": -1, "epochs": int(2 * args.factor) + 1},
            {"model": model, "strategy": "single", "devices": 1, "slow_rank": 0, "epochs": 2},
        ],
    )
    (asp,) = launch(args, [{"model": model, "strategy": "asp", "devices": 2, "slow_rank": 1, "epochs": args.epochs}])
    (ddp,) = launch(args, [{"model": model, "strategy": "ddp", "devices": 2, "slow_rank": 1, "epochs": args.epochs}])
    standalone_sum = fast["throughput"] + slow["throughput"]
    return {
        "standalone_fast": fast,
        "standalone_slow": slow,
        "asp": asp,
        "ddp": ddp,
        "asp_fraction_of_standalone_sum": asp["throughput"] / standalone_sum,
        "ddp_fraction_of_standalone_sum": ddp["throughput"] / standalone_sum,
        "asp_minus_ddp_accuracy_points": 100 * (asp["val_acc"] - ddp["val_acc"]),
    }


def switch_cost(args: argparse.Namespace) -> list[dict]:
    """ASP -> BSP -> ASP on the conv model (0.31M parameters), two workers, no slowdown."""
    job = {"model": "conv", "strategy": "asp", "devices": 2, "slow_rank": -1, "epochs": 3, "alternate_modes": True}
    return launch(args, [job])[0]["switches"]


def print_suite(model: str, result: dict) -> None:
    print(f"\n[{model}] {'run':<28}{'samples/s':>12}{'per rank':>20}{'val acc':>10}{'steps':>8}")
    names = {"standalone_fast": "standalone fast (1 proc)", "standalone_slow": "standalone slow 4x (1 proc)"}
    names.update(asp="ASP: PS + 2 workers", ddp="DDP: 2 workers")
    for key, name in names.items():
        run = result[key]
        per_rank = " / ".join(f"{x:.0f}" for x in run["per_rank_throughput"])
        print(f"{'':<{len(model) + 3}}{name:<28}{run['throughput']:>12.0f}{per_rank:>20}{run['val_acc']:>10.3f}"
              f"{run['global_step']:>8}")  # fmt: skip
    print(f"  ASP aggregate = {result['asp_fraction_of_standalone_sum']:.1%} of the standalone sum (DDP "
          f"{result['ddp_fraction_of_standalone_sum']:.1%}); ASP - DDP accuracy "
          f"{result['asp_minus_ddp_accuracy_points']:+.2f} points")  # fmt: skip
    summary = result["asp"]["server_summary"]
    print(f"  ASP updates per worker {summary['updates_per_worker']}, staleness mean "
          f"{summary['staleness_mean']:.2f}, max {summary['staleness_max']}")  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--role", default="main", choices=["main", "train"])
    parser.add_argument("--out", default="")
    parser.add_argument("--model", default="conv", choices=["mlp", "conv"])
    parser.add_argument("--models", default="conv,mlp", help="main: the suites to run")
    parser.add_argument("--strategy", default="asp", choices=["asp", "ddp", "single"])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--factor", type=float, default=4.0)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--alternate-modes", action="store_true", help="train: switch ASP/BSP at every epoch end")


def main(args: argparse.Namespace) -> None:
    if args.role == "train":
        train(args)
        return

    started, load_before = time.time(), os.getloadavg()
    suites = {model: suite(args, model) for model in args.models.split(",")}
    costs = {
        "apply_0.3M": server_apply_cost(hidden=HIDDEN),
        "apply_4.3M": server_apply_cost(hidden=2048),
        "round_trip_0.3M": round_trip_cost(hidden=HIDDEN),
        "round_trip_4.3M": round_trip_cost(hidden=2048),
    }
    switches = switch_cost(args)
    result = {
        "conditions": {
            "torch_threads_per_process": 1,
            "models": BenchModel.__doc__.split("Args:")[0].strip(),
            "optimizer": "SGD, momentum 0.9 (lr 0.05 mlp, 0.01 conv)",
            "data": f"make_classification({args.samples} train, {NUM_CLASSES} classes, noise={NOISE}), "
            f"batch {args.batch_size} per worker",
            "epochs": f"{args.epochs} for ASP and DDP (accuracy compared there); standalone runs "
            f"{int(2 * args.factor) + 1} (fast) and 2 (slow) epochs, run side by side",
            "measured_epochs": "all but the first (warm-up); validation time excluded",
            "slowdown": f"SlowdownEmulator factor {args.factor} on rank 1; rank 0 hosts the parameter server",
            "note": "2 CPU cores shared with other jobs; numbers vary from run to run",
            "load_average_1_5_15min_before_and_after": [load_before, os.getloadavg()],
        },
        "suites": suites,
        "server_cost": costs,
        "switch_cost_conv_0.31M": switches,
        "wall_s": time.time() - started,
    }
    write_json(RESULTS, result, indent=2)
    for model, suite_result in suites.items():
        print_suite(model, suite_result)
    print()
    for name, cost in costs.items():
        print(f"server cost {name:<16} {cost['us_per_update']:>9.0f} us/update  {cost['us_per_mb']:>7.0f} us/MB")
    for switch in switches:
        print(f"switch to {switch['to']}: {switch['seconds'] * 1000:.1f} ms (conv, 0.31M parameters, 2 workers)")
    print(f"wrote {RESULTS} in {result['wall_s']:.0f} s")
