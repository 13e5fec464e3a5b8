"""The GPU check's benchmark: two ranks, rank 1 slowed 3x, each case a 2-rank job run ``--seeds`` times.
DDP vs HeteroBatch vs the best fixed split, ASP and local SGD accuracy against BSP, AMP, torch.compile, and
(``--layers``) BSP's throughput against DDP's; goals are medians of seed-paired ratios (``<out>/summary.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader

from benchmarks.harness.launch import RESULTS as RESULTS_DIR
from benchmarks.harness.launch import run_ranks, scenario_command
from benchmarks.harness.models import classification_split, flags, quiet_trainer
from benchmarks.harness.record import table, write_json
from benchmarks.harness.stats import median
from lightning_hetero import AsyncPSStrategy, HeteroBatchCallback, SlowdownEmulator
from lightning_hetero.hetero_batch.batches import compiled_graphs
from lightning_hetero.synthetic import MLPClassifier

CASES = ("ddp", "hetero", "fixed", "bsp", "asp", "local", "amp", "compile")
#: rank 0's share of the global batch (256) in the fixed splits tried; the fastest is the best fixed split (192:
#: samples in proportion to speed for a 3x slower rank 1)
FIXED_SPLITS = (176, 192, 208)
GLOBAL_BATCH = 256
SLOWDOWN = 3.0

#: why ``--grid`` does not apply
NO_GRID = "it runs on a GPU machine through scripts/gpu_check.sh, with its own cases"


class Model(MLPClassifier):
    """A wider perceptron. ``tokens`` > 1 or ``depth`` > 0: :class:`TokenStack` (device work that outweighs a step's
    fixed costs); ``layers`` > 0: that many distinct 1024-wide layers (DDP's all-reduce can overlap backward)."""

    def __init__(self, tokens: int = 1, depth: int = 0, layers: int = 0) -> None:
        super().__init__(num_features=64, num_classes=8, hidden=512, lr=0.05, momentum=0.9)
        if layers > 0:
            stack = [module for _ in range(layers) for module in (torch.nn.Linear(1024, 1024), torch.nn.Tanh())]
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.Tanh(), *stack, torch.nn.Linear(1024, 8))
        elif tokens > 1 or depth > 0:
            self.net = TokenStack(64, 8, hidden=1024, tokens=tokens, depth=depth)


class TokenStack(torch.nn.Module):
    """Device work per sample with few parameters to all-reduce (``6 * tokens * depth * hidden**2`` FLOPs, about
    ``hidden**2`` parameters): ``tokens`` learned offsets, ``depth`` residual passes of one shared layer, mean-pooled.

    Example::

        >>> net = TokenStack(64, 8, hidden=32, tokens=4, depth=2)
        >>> net(torch.zeros(3, 64)).shape
        torch.Size([3, 8])
    """

    def __init__(self, num_features: int, num_classes: int, hidden: int, tokens: int, depth: int) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(num_features, hidden)
        self.offsets = torch.nn.Parameter(0.1 * torch.randn(tokens, hidden))
        self.layer = torch.nn.Linear(hidden, hidden)
        self.head = torch.nn.Linear(hidden, num_classes)
        self.depth = depth

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.embed(x))[:, None, :] + self.offsets
        for _ in range(self.depth):
            h = h + torch.tanh(self.layer(h))
        return self.head(h.mean(dim=1))


def _strategy(case: str, device: str):
    backend = "nccl" if device == "cuda" and os.environ.get("BENCH_GPUS") == "2" else "gloo"
    if case in ("bsp", "asp", "local"):
        return AsyncPSStrategy(mode=case, process_group_backend=backend)
    return DDPStrategy(process_group_backend=backend, timeout=timedelta(seconds=120))


def _callbacks(case: str) -> list:
    slow = SlowdownEmulator({1: SLOWDOWN})
    if case in ("ddp", "bsp", "asp", "local"):  # the modes' accuracy is compared without HeteroBatch
        return [slow]
    if case.startswith("fixed"):  # "fixed192": rank 0 takes 192 of the 256
        split = [int(case[5:]), GLOBAL_BATCH - int(case[5:])]
        return [slow, HeteroBatchCallback(min_batch_size=split, max_batch_size=split, verbose=False)]
    return [slow, HeteroBatchCallback(verbose=False)]


def run_case(
    case: str, device: str, epochs: int, samples: int, out: Path, seed: int = 0, tokens: int = 1, depth: int = 0,
    layers: int = 0,
) -> None:  # fmt: skip
    """One case as a 2-rank job; rank 0 writes ``<out>/<case>_s<seed>.json``."""
    torch.manual_seed(seed)
    train, val = classification_split(int(0.8 * samples), samples - int(0.8 * samples), seed + 1, 5.0, 64, 8)
    model = Model(tokens, depth, layers)
    graphs_before = compiled_graphs()
    if case == "compile":  # the network compiled (compiling the whole LightningModule under DDP fails in dynamo here)
        model.net = torch.compile(model.net, backend="inductor" if device == "cuda" else "eager")
    precision = ("16-mixed" if device == "cuda" else "bf16-mixed") if case == "amp" else "32-true"
    trainer = quiet_trainer(accelerator=device, devices=1, num_nodes=2, strategy=_strategy(case, device),
                            precision=precision, max_epochs=epochs, callbacks=_callbacks(case))  # fmt: skip
    started = time.perf_counter()
    trainer.fit(model, DataLoader(train, batch_size=GLOBAL_BATCH // 2, shuffle=True), DataLoader(val, batch_size=256))
    fit_s = time.perf_counter() - started
    hetero = next((c for c in trainer.callbacks if isinstance(c, HeteroBatchCallback)), None)
    on = trainer.strategy.root_device if os.environ.get("BENCH_GPUS") == "2" else "cpu"  # NCCL: device tensors
    graphs = torch.tensor([compiled_graphs() - graphs_before], dtype=torch.float64, device=on)
    per_rank_graphs = trainer.strategy.all_gather(graphs).reshape(-1).cpu().tolist()
    if trainer.is_global_zero:
        report = {
            "case": case,
            "seed": seed,
            "device": device if device == "cpu" else torch.cuda.get_device_name(0),
            "gpus": int(os.environ.get("BENCH_GPUS", "0")),
            "precision": precision,
            "epochs": epochs,
            "fit_s": fit_s,
            "val_acc": float(trainer.callback_metrics.get("val_acc", float("nan"))),
            "final_split": None if hetero is None else list(hetero.batch_sizes),
            "compiled_graphs_per_rank": per_rank_graphs,
        }
        (out / f"{case}_s{seed}.json").write_text(json.dumps(report, indent=1))
    # leave together: a gloo group left alive can abort a rank at interpreter exit ("terminate called without an
    # active exception", exit code -6), which fails the run after its report was written
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def summarize(runs: dict[str, list[dict]]) -> dict:
    """The goals from each case's runs (one per seed, in seed order): medians over seeds of the paired ratios and
    differences; the best fixed split is the ``fixed*`` case with the smallest median fit time. Missing cases give
    ``None``."""
    fixed = [case for case in runs if case.startswith("fixed") and runs[case]]
    best = min(fixed, key=lambda case: statistics.median(r["fit_s"] for r in runs[case])) if fixed else None

    def ratio(case: str) -> float | None:
        pairs = _paired(runs.get(case, []), runs[best] if best is not None else [])
        return statistics.median(b["fit_s"] / r["fit_s"] for r, b in pairs) if pairs else None

    def points(mode: str) -> float | None:
        pairs = _paired(runs.get(mode, []), runs.get("bsp", []))
        return statistics.median(100 * (r["val_acc"] - b["val_acc"]) for r, b in pairs) if pairs else None

    bsp_ddp = _paired(runs.get("bsp", []), runs.get("ddp", []))
    graphs = [max(g) for r in runs.get("compile", []) for g in [r["compiled_graphs_per_rank"]]]
    return {
        "best_fixed": best, "hetero_of_best_fixed": ratio("hetero"), "ddp_of_best_fixed": ratio("ddp"),
        "bsp_of_ddp": statistics.median(d["fit_s"] / b["fit_s"] for b, d in bsp_ddp) if bsp_ddp else None,
        "asp_minus_bsp_points": points("asp"), "local_minus_bsp_points": points("local"),
        "most_graphs_per_rank": max(graphs) if graphs else None,
    }  # fmt: skip


def _paired(runs: list[dict], others: list[dict]) -> list[tuple[dict, dict]]:
    """The runs of ``runs`` and ``others`` with the same seed (else position); a seed failed in either has no pair."""
    by_seed = {other.get("seed", i): other for i, other in enumerate(others)}
    return [(run, by_seed[seed]) for i, run in enumerate(runs) if (seed := run.get("seed", i)) in by_seed]


def _two_ranks(command: list[str], device: str, timeout_s: float) -> str | None:
    """Run ``command`` as ranks 0 and 1 of a two-node job on this host: ``None`` if both succeed, else why (a rank
    that fails, or the job past ``timeout_s``, ends both ranks with everything they started)."""
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    rank_env = {rank: {"BENCH_GPUS": str(min(gpus, 2))} | ({"CUDA_VISIBLE_DEVICES": str(rank)} if gpus >= 2 else {})
                for rank in range(2)}  # fmt: skip
    try:
        run_ranks(command, 2, timeout_s, rank_env)
    except RuntimeError as error:
        return str(error).splitlines()[0]
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--case", help="run one case (internal: the driver calls it)")
    parser.add_argument("--seeds", type=int, default=3, help="runs per case (seeds 0..n-1); medians are reported")
    parser.add_argument("--seed", type=int, default=0, help="the seed of --case (internal)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=20480)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--case-timeout-s", type=float, default=600, help="a run's limit (both ranks killed past it)")
    parser.add_argument("--tokens", type=int, default=1, help="a heavier network (TokenStack): tokens per sample")
    parser.add_argument("--depth", type=int, default=0, help="a heavier network (TokenStack): shared-layer passes")
    parser.add_argument("--layers", type=int, default=0, help="a deep network of this many distinct layers")


def main(args: argparse.Namespace) -> None:
    # stopped from outside (gpu_check.sh's time limit): end the ranks too, which run in their own sessions
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit("gpu: stopped (SIGTERM); ranks ended"))
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu: no CUDA device here; run with --device cpu for the smoke run")
    default = "gpu" if args.device == "cuda" else "gpu_cpu_smoke"
    out = args.out or RESULTS_DIR / default
    out.mkdir(parents=True, exist_ok=True)
    network = (args.tokens, args.depth, args.layers)
    if args.case:
        return run_case(args.case, args.device, args.epochs, args.samples, out, args.seed, *network)
    cases = []
    for case in args.cases.split(","):
        if case not in CASES:
            sys.exit(f"--cases: unknown case {case!r}; choose from {', '.join(CASES)}")
        cases += [f"fixed{share}" for share in FIXED_SPLITS] if case == "fixed" else [case]
    runs: dict[str, list[dict]] = {case: [] for case in cases}
    failures: list[dict] = []
    summary: dict = {}
    conditions = {"slowdown_rank1": SLOWDOWN, "global_batch": GLOBAL_BATCH}
    for seed in range(args.seeds):
        for case in cases:
            settings = flags(
                case=case,
                seed=seed,
                device=args.device,
                epochs=args.epochs,
                samples=args.samples,
                out=out,
                tokens=args.tokens,
                depth=args.depth,
                layers=args.layers,
            )
            report = out / f"{case}_s{seed}.json"
            report.unlink(missing_ok=True)
            why = _two_ranks(scenario_command("gpu", *settings), args.device, args.case_timeout_s)
            if why is None and report.exists():
                runs[case].append(json.loads(report.read_text()))
            else:
                failures.append({"case": case, "seed": seed, "why": why or "no report written"})
                print(f"gpu: {case} seed {seed}: {failures[-1]['why']}", file=sys.stderr, flush=True)
            summary = {"conditions": conditions, "runs": runs, "goals": summarize(runs), "failures": failures}
            write_json(out / "summary.json", summary, quiet=True)
    header = ["case", "fit s (median)", "val acc (median)", "split (last seed)", "graphs/rank (last seed)"]
    cells = [[case, median(r["fit_s"] for r in reports), median(r["val_acc"] for r in reports),
              reports[-1]["final_split"] if reports else "failed", reports[-1]["compiled_graphs_per_rank"] if reports
              else None] for case, reports in runs.items()]  # fmt: skip
    text = table(header, cells, ["", ".1f", ".3f", "", ""]) + "\n" + json.dumps(summary["goals"], indent=1)
    (out / "table.txt").write_text(text + "\n")
    print(text)
    if failures:
        sys.exit(f"gpu: {len(failures)} of {len(cases) * args.seeds} runs failed (summary.json: failures)")
