"""Elastic ASP (``on_worker_lost="continue"``) losing 1 of 3 workers mid-epoch, against the same run undisturbed.
Final accuracy, whether every epoch trained every sample once, the server's updates and the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.harness.launch import RESULTS as RESULTS_DIR
from benchmarks.harness.launch import run_ranks, scenario_command
from benchmarks.harness.record import write_json

RESULTS = RESULTS_DIR / "faults.json"
WORLD_SIZE, KILLED_RANK, BATCH_SIZE, NUM_CLASSES, FEATURES, NOISE = 3, 2, 32, 10, 32, 2.5

#: why ``--grid`` does not apply
NO_GRID = "its figure is correctness after a lost worker (every epoch covered once), not a tuned throughput"


def worker(args: argparse.Namespace) -> None:
    """One rank: train, record the sample indices per epoch, write ``rank{k}.json`` (or ``lost.json`` and die)."""
    import lightning as L
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from benchmarks.harness.models import finish, quiet_trainer
    from lightning_hetero.async_ps import AsyncPSStrategy
    from lightning_hetero.synthetic import MLPClassifier, make_classification

    def indexed(x: torch.Tensor, y: torch.Tensor) -> TensorDataset:
        """Samples that carry their index, so that every epoch's coverage can be checked."""
        return TensorDataset(x, y, torch.arange(len(y)))

    class Model(MLPClassifier):
        def __init__(self):
            super().__init__(num_features=FEATURES, num_classes=NUM_CLASSES, hidden=128, lr=0.05, momentum=0.5)
            data = make_classification(args.samples * 5 // 4, FEATURES, NUM_CLASSES, seed=args.seed, noise=NOISE)
            self.train_set = indexed(*(t[: args.samples] for t in data.tensors))
            self.val_set = indexed(*(t[args.samples :] for t in data.tensors))
            self.seen: dict[int, list[int]] = {}
            self.batches_in_kill_epoch = 0

        def training_step(self, batch, batch_idx):
            x, y, idx = batch
            self.seen.setdefault(self.current_epoch, []).extend(idx.tolist())
            if self.global_rank == args.kill_rank and self.current_epoch == 1:
                self.batches_in_kill_epoch += 1
                if self.batches_in_kill_epoch == args.kill_after:
                    pushed = {e: s if e != 1 else s[: -len(idx)] for e, s in self.seen.items()}
                    (Path(args.out) / "lost.json").write_text(json.dumps(pushed))
                    os.kill(os.getpid(), signal.SIGKILL)
            return nn.functional.cross_entropy(self(x), y)

        def validation_step(self, batch, batch_idx):
            x, y, _ = batch
            correct = (self(x).argmax(-1) == y).float().sum()
            self.log("val_correct", correct, reduce_fx="sum", sync_dist=True, batch_size=1)
            self.log("val_count", float(len(y)), reduce_fx="sum", sync_dist=True, batch_size=1)

        def train_dataloader(self):
            return DataLoader(self.train_set, batch_size=BATCH_SIZE, shuffle=True)

        def val_dataloader(self):
            return DataLoader(self.val_set, batch_size=256)

    torch.set_num_threads(1)
    L.seed_everything(args.seed, verbose=False)
    strategy = AsyncPSStrategy(fault_timeout_s=60, on_worker_lost="continue")
    trainer = quiet_trainer(
        devices=1, num_nodes=WORLD_SIZE, strategy=strategy, max_epochs=args.epochs, num_sanity_val_steps=0
    )
    model = Model()
    start = time.perf_counter()
    trainer.fit(model)
    metrics = trainer.callback_metrics
    report = {
        "seen": model.seen,
        "val_acc": float(metrics["val_correct"] / metrics["val_count"]),
        "val_count": int(metrics["val_count"]),
        "updates": strategy.version,
        "fit_s": time.perf_counter() - start,
    }
    finish(trainer, Path(args.out) / f"rank{trainer.global_rank}.json", report, every_rank=True)


def run(seed: int, epochs: int, samples: int, disturbed: bool, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    # rank 2 dies a third of the way through its share of epoch 1
    kill_after = max(2, samples // BATCH_SIZE // WORLD_SIZE // 3)
    command = scenario_command("faults", "worker", out, "--seed", seed, "--epochs", epochs, "--samples", samples)
    command += ["--kill-rank", str(KILLED_RANK if disturbed else -1), "--kill-after", str(kill_after)]
    start = time.perf_counter()
    logs = run_ranks(command, WORLD_SIZE, may_fail=[KILLED_RANK] if disturbed else [])
    wall_s = time.perf_counter() - start
    survivors = [rank for rank in range(WORLD_SIZE) if not (disturbed and rank == KILLED_RANK)]
    reports = [json.loads((out / f"rank{rank}.json").read_text()) for rank in survivors]
    lost = json.loads((out / "lost.json").read_text()) if disturbed else {}
    coverage = []
    for epoch in range(epochs):
        seen = [i for report in reports for i in report["seen"].get(str(epoch), [])] + lost.get(str(epoch), [])
        coverage.append(sorted(seen) == list(range(samples)))
    return {
        "seed": seed,
        "run": "lose rank 2 in epoch 1" if disturbed else "undisturbed",
        "val_acc": reports[0]["val_acc"],
        "val_samples": reports[0]["val_count"],
        "every_epoch_covered_once": all(coverage),
        "updates": reports[0]["updates"],
        "wall_s": round(wall_s, 1),
        "warned": "continuing with 2 workers" in logs[0],
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="command")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--samples", type=int, default=4096)
    work = sub.add_parser("worker")
    work.add_argument("out")
    for name, kind in (("--seed", int), ("--epochs", int), ("--samples", int), ("--kill-rank", int)):
        work.add_argument(name, type=kind, required=True)
    work.add_argument("--kill-after", type=int, default=5)


def main(args: argparse.Namespace) -> None:
    if args.command == "worker":
        worker(args)
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            for disturbed in (False, True):
                row = run(seed, args.epochs, args.samples, disturbed, Path(tmp) / f"{seed}-{int(disturbed)}")
                rows.append(row)
                print(row, flush=True)
    accuracy = {
        name: statistics.median(r["val_acc"] for r in rows if r["run"] == name)
        for name in ("undisturbed", "lose rank 2 in epoch 1")
    }
    gaps = [kept["val_acc"] - lost["val_acc"] for kept, lost in zip(rows[::2], rows[1::2], strict=True)]
    print(f"\n| run | val acc (median of {args.seeds}) | every epoch covered once | updates | wall s |")
    print("|---|---:|---|---:|---:|")
    for name, value in accuracy.items():
        runs = [r for r in rows if r["run"] == name]
        print(
            f"| {name} | {value:.4f} | {all(r['every_epoch_covered_once'] for r in runs)} | "
            f"{runs[0]['updates']} | {statistics.median(r['wall_s'] for r in runs)} |"
        )
    print(f"accuracy gap per seed (undisturbed - disturbed, points): {[round(100 * g, 2) for g in gaps]}")
    conditions = {"world_size": WORLD_SIZE, "batch_size": BATCH_SIZE, "noise": NOISE}
    result = {
        "conditions": conditions,
        "runs": rows,
        "median_val_acc": accuracy,
        "gap_points_per_seed": [100 * g for g in gaps],
    }
    write_json(RESULTS, result)
