"""The GPU check's benchmark: two ranks, rank 1 slowed 3x; DDP vs HeteroBatch vs the best fixed split, ASP and local
SGD accuracy against BSP, AMP and torch.compile with changing sizes (graphs compiled per rank).

Usage::

    python benchmarks/bench_gpu.py                  # CUDA: 2 GPUs on NCCL where present, else 2 ranks on one GPU (gloo)
    python benchmarks/bench_gpu.py --device cpu --cases hetero --epochs 1   # the CPU smoke run (tests use it)

Each case runs as its own 2-rank Lightning job: the driver starts this script twice with ``--case`` as two one-device
"nodes" (two GPUs: one each, NCCL; one GPU: both on it, gloo, since NCCL refuses two ranks on one GPU).
Writes ``<out>/<case>.json`` per case and ``<out>/summary.json``, and prints a table. Default ``--out``:
``benchmarks/results/gpu`` on CUDA, ``benchmarks/results/gpu_cpu_smoke`` on CPU. Rank 1 is slowed by
``SlowdownEmulator`` (sleeps in the step: on CUDA the host launches its kernels late).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader

from lightning_hetero import AsyncPSStrategy, HeteroBatchCallback, SlowdownEmulator
from lightning_hetero.hetero_batch.compile_shapes import compiled_graphs
from lightning_hetero.synthetic import MLPClassifier, make_classification

CASES = ("ddp", "hetero", "fixed", "bsp", "asp", "local", "amp", "compile")
#: the fixed split for a 3x slower rank 1 (global batch 256): samples in proportion to speed
BEST_FIXED = (192, 64)
SLOWDOWN = 3.0


def _data(samples: int, seed: int = 1):
    data = make_classification(samples, num_features=64, num_classes=8, seed=seed, noise=5.0)
    x, y = data.tensors
    split = int(0.8 * samples)
    return torch.utils.data.TensorDataset(x[:split], y[:split]), torch.utils.data.TensorDataset(x[split:], y[split:])


class Model(MLPClassifier):
    """A wider perceptron; validation accuracy logged across ranks."""

    def __init__(self) -> None:
        super().__init__(num_features=64, num_classes=8, hidden=512, lr=0.05, momentum=0.9)


def _strategy(case: str, device: str):
    backend = "nccl" if device == "cuda" and os.environ.get("BENCH_GPUS") == "2" else "gloo"
    if case in ("bsp", "asp", "local"):
        return AsyncPSStrategy(mode=case, process_group_backend=backend)
    return DDPStrategy(process_group_backend=backend, timeout=timedelta(seconds=120))


def _callbacks(case: str) -> list:
    slow = SlowdownEmulator({1: SLOWDOWN})
    if case == "ddp":
        return [slow]
    if case == "fixed":
        return [slow, HeteroBatchCallback(min_batch_size=list(BEST_FIXED), max_batch_size=list(BEST_FIXED))]
    return [slow, HeteroBatchCallback(verbose=False)]


def run_case(case: str, device: str, epochs: int, samples: int, out: Path) -> None:
    """One case as a 2-rank job; rank 0 writes ``<out>/<case>.json``."""
    torch.manual_seed(0)
    train, val = _data(samples)
    model = Model()
    graphs_before = compiled_graphs()
    if case == "compile":  # the network compiled (compiling the whole LightningModule under DDP fails in dynamo here)
        model.net = torch.compile(model.net, backend="inductor" if device == "cuda" else "eager")
    precision = ("16-mixed" if device == "cuda" else "bf16-mixed") if case == "amp" else "32-true"
    trainer = L.Trainer(
        accelerator=device,
        devices=1,
        num_nodes=2,
        strategy=_strategy(case, device),
        precision=precision,
        max_epochs=epochs,
        callbacks=_callbacks(case),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    started = time.perf_counter()
    trainer.fit(model, DataLoader(train, batch_size=128, shuffle=True), DataLoader(val, batch_size=256))
    fit_s = time.perf_counter() - started
    hetero = next((c for c in trainer.callbacks if isinstance(c, HeteroBatchCallback)), None)
    graphs = torch.tensor([compiled_graphs() - graphs_before], dtype=torch.float64)
    per_rank_graphs = trainer.strategy.all_gather(graphs).reshape(-1).tolist()
    if trainer.is_global_zero:
        report = {
            "case": case,
            "device": device if device == "cpu" else torch.cuda.get_device_name(0),
            "gpus": int(os.environ.get("BENCH_GPUS", "0")),
            "precision": precision,
            "epochs": epochs,
            "fit_s": fit_s,
            "val_acc": float(trainer.callback_metrics.get("val_acc", float("nan"))),
            "final_split": None if hetero is None else list(hetero.batch_sizes),
            "compiled_graphs_per_rank": per_rank_graphs,
        }
        (out / f"{case}.json").write_text(json.dumps(report, indent=1))


def summarize(reports: dict[str, dict]) -> dict:
    """The goal ratios from the cases' reports (missing cases give ``None``).

    Example::

        >>> summarize({"hetero": {"fit_s": 10.0, "val_acc": 0.9}, "fixed": {"fit_s": 9.0, "val_acc": 0.9},
        ...            "bsp": {"val_acc": 0.9}, "asp": {"val_acc": 0.897}})["hetero_of_best_fixed"]
        0.9
    """

    def ratio(a: str, b: str) -> float | None:
        return reports[b]["fit_s"] / reports[a]["fit_s"] if a in reports and b in reports else None

    def points(mode: str) -> float | None:
        if mode not in reports or "bsp" not in reports:
            return None
        return 100 * (reports[mode]["val_acc"] - reports["bsp"]["val_acc"])

    return {
        "hetero_of_best_fixed": ratio("hetero", "fixed"),
        "ddp_of_best_fixed": ratio("ddp", "fixed"),
        "asp_minus_bsp_points": points("asp"),
        "local_minus_bsp_points": points("local"),
        "compiled_graphs_per_rank": reports.get("compile", {}).get("compiled_graphs_per_rank"),
    }


def _two_ranks(command: list[str], device: str) -> None:
    """Run ``command`` as ranks 0 and 1 of a two-node job on this host; fail if either fails."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NODE_RANK=str(rank), LOCAL_RANK="0",
                   WORLD_SIZE="2", BENCH_GPUS=str(min(gpus, 2)))  # fmt: skip
        if gpus >= 2:
            env["CUDA_VISIBLE_DEVICES"] = str(rank)
        procs.append(subprocess.Popen(command, env=env))
    codes = [proc.wait(timeout=1800) for proc in procs]
    if any(codes):
        sys.exit(f"bench_gpu: a rank failed ({codes}) running {' '.join(command)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--case", help="run one case (internal: the driver calls it)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=20480)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_gpu: no CUDA device here; run with --device cpu for the smoke run")
    default = "gpu" if args.device == "cuda" else "gpu_cpu_smoke"
    out = args.out or Path(__file__).resolve().parent / "results" / default
    out.mkdir(parents=True, exist_ok=True)
    if args.case:
        run_case(args.case, args.device, args.epochs, args.samples, out)
        return
    reports = {}
    for case in args.cases.split(","):
        if case not in CASES:
            sys.exit(f"--cases: unknown case {case!r}; choose from {', '.join(CASES)}")
        command = [sys.executable, __file__, "--case", case, "--device", args.device, "--epochs", str(args.epochs),
                   "--samples", str(args.samples), "--out", str(out)]  # fmt: skip
        _two_ranks(command, args.device)
        reports[case] = json.loads((out / f"{case}.json").read_text())
    summary = {"cases": reports, "goals": summarize(reports)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"{'case':<8} {'fit s':>8} {'val acc':>8}  split      graphs/rank")
    for case, report in reports.items():
        split = report["final_split"] or "-"
        print(f"{case:<8} {report['fit_s']:>8.1f} {report['val_acc']:>8.3f}  {split!s:<10} "
              f"{report['compiled_graphs_per_rank']}")  # fmt: skip
    print(json.dumps(summary["goals"], indent=1))


if __name__ == "__main__":
    main()
