"""ASP at scale: ``AsyncPSStrategy``'s throughput against the ideal, 2 to 16 workers, 0.25M to 17M parameters.

Equal workers whose step sleeps ``step_ms`` (or ``--emulation quota``) around one linear layer; ASP/ideal is ASP's
samples/s over the sum of N standalone jobs side by side. ``--variant LABEL=JSON_KWARGS``: ASP variants.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.harness.grid import Cell
from benchmarks.harness.launch import RESULTS as RESULTS_DIR
from benchmarks.harness.launch import child_env, run_jobs, scenario_command
from benchmarks.harness.models import StartTogether, finish, flags, quiet_trainer
from benchmarks.harness.record import table, write_json
from benchmarks.harness.stats import median
from lightning_hetero import SlowdownEmulator
from lightning_hetero.asp.layout import FlatLayout
from lightning_hetero.asp.protocol import PushHeader, new_message
from lightning_hetero.asp.server import ParameterServer
from lightning_hetero.async_ps import AsyncPSStrategy

RESULTS = RESULTS_DIR / "ps_scale.json"
#: model name -> width of the square linear layer (``width * (width + 1)`` parameters)
MODELS = {"0.25M": 500, "4.3M": 2073, "17M": 4123}
#: the issue's goal configurations (a 3 ms sleep makes the ~4.5 ms steps of the issue's first goal)
QUICK = ("2x0.25Mx3", "4x4.3Mx65", "16x0.25Mx65")
BATCH = 2

#: the flag that names the JSON written (``--json``; ``--out`` is a training job's folder)
OUT_DEST = "json"


class ScaleModel(L.LightningModule):
    """One square linear layer ``width`` wide; ``training_step`` sleeps ``step_ms`` first (the emulated compute)."""

    def __init__(self, width: int, step_ms: float) -> None:
        super().__init__()
        self.width = width
        self.layer = nn.Linear(width, width)
        self.step_s = step_ms / 1000
        self.slept_s = 0.0

    def training_step(self, batch, batch_idx):
        time.sleep(self.step_s)
        self.slept_s += self.step_s
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3, momentum=0.9)


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


def train(args: argparse.Namespace) -> None:
    """One job (re-run by Lightning's launcher for the other ranks); each rank writes a JSON report."""
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    # under a quota q, the emulated compute is q x step_ms charged as CPU time: an idle host's step still takes about
    # step_ms, and the real work (the server, the pushes) is stretched by 1/q, as in a container at q CPUs
    quota = args.quota if args.emulation == "quota" else 1.0
    model = ScaleModel(MODELS[args.model], args.step_ms * quota)
    data = TensorDataset(torch.randn(args.samples, model.width), torch.randn(args.samples, model.width))
    windows = EpochWindows()
    callbacks: list[Callback] = [windows]
    if args.emulation == "quota":
        factors = {rank: 1 / quota for rank in range(args.devices)}
        callbacks.append(
            SlowdownEmulator(factors, throttle="cfs", cpu_clock=lambda: time.process_time() + model.slept_s)
        )
    if args.start_together:
        callbacks.append(StartTogether(args.start_together, args.start_together_jobs))
    strategy = asp_strategy(json.loads(args.strategy_kwargs)) if args.strategy == "asp" else "auto"
    trainer = quiet_trainer(devices=args.devices, strategy=strategy, max_epochs=args.epochs, callbacks=callbacks,
                            num_sanity_val_steps=0, limit_val_batches=0)  # fmt: skip
    trainer.fit(model, DataLoader(data, batch_size=BATCH, shuffle=True))
    report = {"windows": windows.windows, "server_summary": getattr(trainer.strategy, "server_summary", None)}
    finish(trainer, Path(args.out, f"rank{trainer.global_rank}.json"), report, every_rank=True)


def parse_config(text: str) -> dict:
    """``"4x4.3Mx65"`` -> ``{"workers": 4, "model": "4.3M", "step_ms": 65.0}``."""
    workers, model, step_ms = text.split("x")
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r} in --configs; known: {sorted(MODELS)}")
    return {"workers": int(workers), "model": model, "step_ms": float(step_ms)}


def _samples(config: dict, epoch_s: float, workers: int) -> int:
    """Samples for one epoch of about ``epoch_s`` seconds when ``workers`` ideal workers share it."""
    steps = math.ceil(epoch_s * workers * 1000 / (config["step_ms"] + 2.0))
    return max(steps, 4 * workers) * BATCH


def asp_strategy(kwargs: dict) -> AsyncPSStrategy:
    """``AsyncPSStrategy`` from a variant's JSON keywords, the expert knobs among them given as ``advanced=``; an older
    checkout (a variant's ``SRC``) has no ``PSAdvanced`` and takes them as keywords."""
    try:
        from lightning_hetero.async_ps import PSAdvanced
    except ImportError:
        return AsyncPSStrategy(**kwargs)
    knobs = {name for name in kwargs if name in PSAdvanced.__dataclass_fields__}
    advanced = PSAdvanced(**{name: kwargs[name] for name in knobs})
    return AsyncPSStrategy(**{name: value for name, value in kwargs.items() if name not in knobs}, advanced=advanced)


def parse_variant(text: str) -> dict:
    """``'overlap={"overlap_round_trip": true}'`` or ``'main={}@/path/to/src'`` -> label, strategy kwargs, source."""
    label, _, rest = text.partition("=")
    kwargs, _, source = rest.partition("@")
    return {"label": label, "kwargs": json.loads(kwargs or "{}"), "source": source}


def _run(args: argparse.Namespace, jobs: list[dict], source: str = "") -> list[list[dict]]:
    """Start jobs side by side (with ``source`` first on ``PYTHONPATH`` when given), wait for all; each job's ranks'
    reports."""
    with tempfile.TemporaryDirectory() as tmp:
        commands, outs = [], []
        for i, job in enumerate(jobs):
            out = Path(tmp, str(i))
            out.mkdir()
            commands.append(scenario_command("ps_scale", "--role", "train", "--out", out, *flags(
                **job, emulation=args.emulation, quota=args.quota)))  # fmt: skip
            outs.append(out)
        run_jobs(commands, 600, child_env(source), Path(tmp, "logs"))
        return [
            [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(job["devices"])]
            for job, out in zip(jobs, outs, strict=True)
        ]


def _throughput(reports: list[dict], epochs: int) -> dict:
    measured = [str(epoch) for epoch in range(1, epochs)]
    samples = sum(r["windows"][e]["samples"] for r in reports for e in measured)
    seconds = sum(
        max(r["windows"][e]["end"] for r in reports) - min(r["windows"][e]["start"] for r in reports) for e in measured
    )
    return {"samples_per_s": samples / seconds, "seconds": seconds, "samples": samples}


def measure(args: argparse.Namespace, config: dict, variants: list[dict], rotation: int) -> dict:
    """One repeat of one configuration: N standalone workers side by side, and ASP with N workers for each variant,
    in an order rotated by ``rotation`` (so that no variant always runs first or last)."""
    workers = config["workers"]
    common = {"model": config["model"], "step_ms": config["step_ms"]}
    standalone_job = {
        **common,
        "strategy": "single",
        "devices": 1,
        "epochs": args.epochs,
        "samples": _samples(config, args.epoch_s, 1),
    }
    names = ["standalone"] + [variant["label"] for variant in variants]
    shift = rotation % len(names)
    result: dict = {"uptime": {}, "order": names[shift:] + names[:shift], "variants": {}}
    for name in result["order"]:
        result["uptime"][name] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        if name == "standalone":
            with tempfile.TemporaryDirectory() as meeting:
                together = {"start_together": meeting, "start_together_jobs": workers}
                jobs = _run(args, [{**standalone_job, **together}] * workers)
            result["standalone"] = [_throughput(reports, args.epochs) for reports in jobs]
            continue
        variant = next(v for v in variants if v["label"] == name)
        asp_job = {
            **common,
            "strategy": "asp",
            "devices": workers,
            "epochs": args.epochs,
            "samples": _samples(config, args.epoch_s, workers),
            "strategy_kwargs": json.dumps(variant["kwargs"]),
        }
        (reports,) = _run(args, [asp_job], variant["source"])
        asp = _throughput(reports, args.epochs)
        asp["per_rank_samples"] = [sum(r["windows"][str(e)]["samples"] for e in range(1, args.epochs)) for r in reports]
        result["variants"][name] = {"asp": asp, "server_summary": reports[0]["server_summary"]}
    result["ideal_samples_per_s"] = sum(s["samples_per_s"] for s in result["standalone"])
    result["standalone_step_ms"] = statistics.median(1000 * BATCH / s["samples_per_s"] for s in result["standalone"])
    first = result["variants"][variants[0]["label"]]["asp"]["samples_per_s"]
    for run in result["variants"].values():
        run["asp_over_ideal"] = run["asp"]["samples_per_s"] / result["ideal_samples_per_s"]
        run["over_first"] = run["asp"]["samples_per_s"] / first
        stats = (run["server_summary"] or {}).get("server")
        if stats:
            run["server_busy_fraction"] = stats["busy_fraction"]
            run["server_us_per_mb"] = stats["us_per_mb"]
        shards = (run["server_summary"] or {}).get("shards")
        if shards:  # server_shards > 1: the busiest shard, and each one's cost per MB of its own slice
            run["server_busy_fraction"] = max(shard["busy_fraction"] for shard in shards)
            run["shards_busy_fraction"] = [shard["busy_fraction"] for shard in shards]
            run["shards_us_per_mb"] = [shard["us_per_mb"] for shard in shards]
    return result


def server_apply_cost(model: str, updates: int) -> dict:
    """In-process: the server applying one pushed gradient and filling the reply (SGD, momentum 0.9)."""
    torch.set_num_threads(1)
    layer = nn.Linear(MODELS[model], MODELS[model])
    params = list(layer.parameters())
    layout = FlatLayout.from_named_parameters(layer.named_parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    template = torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    server = ParameterServer(layout, flat, template, {id(p): i for i, p in enumerate(params)}, world_size=2)
    grad, reply = torch.randn(layout.numel), new_message(layout.numel)
    header = PushHeader(0, 0, 0.5)
    times = []
    for i in range(updates + 5):
        start = time.perf_counter()
        server.apply(1, header._replace(base_version=server.version), grad, reply)
        if i >= 5:
            times.append(time.perf_counter() - start)
    us, mb = statistics.median(times) * 1e6, layout.numel * 4 / 1e6
    return {"params": layout.numel, "mb": mb, "us_per_update": us, "us_per_mb": us / mb}


def summarise(runs: list[dict], label: str) -> dict:
    """Medians over repeats of one configuration for one variant."""
    mine = [r["variants"][label] for r in runs]
    return {
        "asp_over_ideal_median": median([m["asp_over_ideal"] for m in mine]),
        "asp_over_ideal_each": [m["asp_over_ideal"] for m in mine],
        "asp_samples_per_s_median": median([m["asp"]["samples_per_s"] for m in mine]),
        "ideal_samples_per_s_median": median([r["ideal_samples_per_s"] for r in runs]),
        "over_first_median": median([m["over_first"] for m in mine if "over_first" in m]),
        "over_first_each": [m["over_first"] for m in mine if "over_first" in m],
        "standalone_step_ms_median": median([r["standalone_step_ms"] for r in runs]),
        "server_busy_fraction_median": median([m["server_busy_fraction"] for m in mine if "server_busy_fraction" in m]),
        "server_us_per_mb_median": median([m["server_us_per_mb"] for m in mine if "server_us_per_mb" in m]),
        "staleness_mean_median": median([m["server_summary"]["staleness_mean"] for m in mine if m["server_summary"]]),
    }


def print_table(summary: dict[str, dict[str, dict]], costs: dict[str, dict]) -> None:
    keys = (
        "asp_samples_per_s_median",
        "ideal_samples_per_s_median",
        "standalone_step_ms_median",
        "server_busy_fraction_median",
        "server_us_per_mb_median",
        "staleness_mean_median",
        "over_first_median",
    )
    header = ["config", "variant", "ASP/ideal", "(repeats)", "ASP s/s", "ideal s/s", "step ms", "busy", "us/MB",
              "stale", "/first"]  # fmt: skip
    rows = [
        [name, label, row["asp_over_ideal_median"], ", ".join(f"{x:.2f}" for x in row["asp_over_ideal_each"])]
        + [row[key] for key in keys]
        for name, by_variant in summary.items()
        for label, row in by_variant.items()
    ]
    print("\n" + table(header, rows, ["", "", ".2f", "", ".0f", ".0f", ".1f", ".2f", ".0f", ".2f", ".2f"]) + "\n")
    for model, cost in costs.items():
        print(f"server apply {model:<6} {cost['us_per_update']:>9.0f} us/update  {cost['us_per_mb']:>7.0f} us/MB")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--role", default="main", choices=["main", "train"])
    parser.add_argument("--configs", default="", help="comma-separated WORKERSxMODELxSTEP_MS, e.g. 4x4.3Mx65")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3, help="the first is warm-up")
    parser.add_argument("--epoch-s", type=float, default=1.5, help="target duration of an ideal epoch")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="LABEL=JSON_KWARGS[@SRC]: an ASP variant, AsyncPSStrategy(**kwargs) with SRC first on "
        "PYTHONPATH (e.g. another checkout's src/); repeat to compare variants side by side against "
        "the same standalone runs (default: asp={})",
    )
    parser.add_argument("--strategy-kwargs", default="{}", help="train: JSON keyword arguments for AsyncPSStrategy")
    parser.add_argument("--apply-updates", type=int, default=30, help="updates timed per model for the server cost")
    parser.add_argument("--json", default=str(RESULTS), help="where to write the results")
    # a training job's own arguments
    parser.add_argument("--out", default="")
    parser.add_argument("--strategy", default="asp", choices=["asp", "single"])
    parser.add_argument("--model", default="0.25M", choices=sorted(MODELS))
    parser.add_argument("--step-ms", type=float, default=5.0)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--start-together", default="", help="standalone jobs: a folder where they meet to start")
    parser.add_argument("--start-together-jobs", type=int, default=1)
    parser.add_argument("--emulation", default="sleep", choices=["sleep", "quota"], help="sleeps, or a CPU quota")
    parser.add_argument("--quota", type=float, default=0.5, help="with --emulation quota: CPUs per worker")


def _reshape(configs: str, workers: float = 1.0, step: float = 1.0) -> str:
    """``--configs`` with each configuration's workers and step time scaled.

    Example::

        >>> _reshape("2x0.25Mx3,4x4.3Mx65", workers=2, step=0.5)
        '4x0.25Mx1.5,8x4.3Mx32.5'
    """
    scaled = []
    for text in configs.split(","):
        config = parse_config(text)
        scaled.append(f"{round(config['workers'] * workers)}x{config['model']}x{config['step_ms'] * step:g}")
    return ",".join(scaled)


def grid_axes(args: argparse.Namespace) -> dict[str, list[Cell] | str]:
    """From ``--configs`` (default: the issue's goal configurations); ASP/ideal of each configuration and variant."""
    args.configs = args.configs or ",".join(QUICK)
    other = "quota" if args.emulation == "sleep" else "sleep"
    return {
        "emulation": [Cell("emulation", f"{other} {args.quota:g} CPU" if other == "quota" else other, {"emulation": other})],
        "cost": [Cell("cost", f"x{k:g}", {"configs": _reshape(args.configs, step=k)}) for k in (0.5, 2)],
        "epoch": [Cell("epoch", f"x{k:g}", {"epoch_s": args.epoch_s * k}) for k in (0.25, 4)],
        "workers": [Cell("workers", "x2", {"configs": _reshape(args.configs, workers=2)})],
        "quota": [Cell("quota", f"{q:g} CPU", {"emulation": "quota", "quota": q}) for q in (0.25,) if q != args.quota],
    }  # fmt: skip


def figures(payload: dict) -> dict[str, float]:
    """ASP (or the variant's mode) over the ideal, per configuration and variant; the grid's cells name their
    configurations by position, so that a scaled configuration is the same figure."""
    return {
        f"config {i} {label}": row["asp_over_ideal_median"]
        for i, by_variant in enumerate(payload["summary"].values())
        for label, row in by_variant.items()
    }


def main(args: argparse.Namespace) -> None:
    if args.role == "train":
        train(args)
        return
    configs = (args.configs or ",".join(QUICK)).split(",")
    parsed = {name: parse_config(name) for name in configs}
    variants = [parse_variant(text) for text in args.variant]
    variants = variants or [parse_variant("asp={}")]
    started = time.time()
    runs: dict[str, list[dict]] = {name: [] for name in configs}

    def write(costs: dict[str, dict], complete: bool) -> dict:
        """Write what was measured so far (after every repeat, so that a run cut short leaves its repeats)."""
        summary = {
            name: {v["label"]: summarise(runs[name], v["label"]) for v in variants} for name in configs if runs[name]
        }
        result = {
            "complete": complete,
            "variants": variants,
            "summary": summary,
            "runs": runs,
            "server_apply_cost_this_checkout": costs,
            "wall_s": time.time() - started,
        }
        write_json(args.json, result, indent=2, quiet=True)
        return result

    for repeat in range(args.repeats):
        for i, name in enumerate(configs):
            run = measure(args, parsed[name], variants, rotation=repeat + i)
            runs[name].append(run)
            ratios = ", ".join(f"{label} {v['asp_over_ideal']:.2f}" for label, v in run["variants"].items())
            print(f"repeat {repeat} {name}: ASP/ideal {ratios} ({run['uptime']['standalone']})", flush=True)
            write({}, complete=False)
    models = sorted({parsed[name]["model"] for name in configs}, key=lambda m: MODELS[m])
    costs = {model: server_apply_cost(model, args.apply_updates) for model in models}
    result = write(costs, complete=True)
    print_table(result["summary"], costs)
    print(f"wrote {args.json} in {result['wall_s']:.0f} s")
