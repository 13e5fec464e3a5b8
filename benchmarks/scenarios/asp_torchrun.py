"""ASP under torchrun's elastic agent: an undisturbed 2-node job against one where a third node joins and later dies.
Per membership change: the updates lost and the time without training (docs/elastic.md's recipe, on CPU).
"""

from __future__ import annotations

import argparse
import itertools
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.launch import RESULTS
from benchmarks.harness.record import write_json
from benchmarks.torchrun_job import TorchrunJob, join_and_leave

#: why ``--grid`` does not apply
NO_GRID = "its figures are membership-change times under torchrun, not a tuned throughput"


def run(kind: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    worker_args = ("--epochs", str(args.epochs), "--samples", str(args.samples), "--batch-size", "32",
                   "--step-sleep-s", str(args.step_sleep_s), "--noise", str(args.noise), "--validate")  # fmt: skip
    started = time.time()
    with TorchrunJob(folder / kind, worker_args=worker_args) as job:
        if kind == "churn":
            statuses = join_and_leave(job, join_after_s=2.0, leave_after_s=0.5)
        else:
            job.start("a")
            job.wait_for_rendezvous_store()
            job.start("b")
            statuses = job.wait(300)
        attempts, steps, final = job.attempts(), job.steps(), job.final()
        agents_started, killed = job.started, job.killed
    wall_s = max(step["t"] for step in steps) - started
    once = all(c == 1 for counts in final["counts"].values() for c in counts) and len(final["counts"]) == args.epochs
    kept = ("world_size", "epoch", "global_step", "reason", "restart_count")
    result: dict[str, Any] = {
        "statuses": statuses, "wall_s": round(wall_s, 2), "val_acc": final["val_acc"],
        "global_step": final["global_step"], "epochs": final["current_epoch"], "every_sample_once": once,
        "attempts": [{key: a[key] for key in kept} for a in attempts],
    }  # fmt: skip
    if kind == "churn":
        first_c = min(step["t"] for step in steps if step["node"] == "c")
        result["join_to_first_update_s"] = round(first_c - agents_started["c"], 2)
        result["leave_killed_at_s"] = round(killed["c"] - started, 2)
        result["changes"] = changes(attempts, steps)
    return result


def changes(attempts: list[dict], steps: list[dict]) -> list[dict[str, Any]]:
    """Per membership change: updates trained by the stopped attempt but not in the checkpoint resumed, and the
    time without training."""
    out = []
    for before, after in itertools.pairwise(attempts):
        trained = [s for s in steps if before["t"] <= s["t"] < after["t"]]
        lost = len(trained) - (after["global_step"] - before["global_step"])
        idle_s = min(s["t"] for s in steps if s["t"] >= after["t"]) - max(s["t"] for s in trained)
        out.append({"change": after["reason"], "updates_lost": lost, "seconds_without_training": round(idle_s, 2)})
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--step-sleep-s", type=float, default=0.05)
    parser.add_argument("--noise", type=float, default=2.0, help="make_classification's noise (0.5 saturates)")
    parser.add_argument("--out", default="asp_torchrun.json")


def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        results = {kind: run(kind, args, Path(tmp)) for kind in ("undisturbed", "churn")}
    undisturbed, churn = results["undisturbed"], results["churn"]
    print(f"{'run':<12} {'wall s':>7} {'val_acc':>8} {'steps':>6} {'once':>5}  attempts (world sizes)")
    for kind, r in results.items():
        worlds = ",".join(str(a["world_size"]) for a in r["attempts"])
        print(f"{kind:<12} {r['wall_s']:>7.1f} {r['val_acc']:>8.4f} {r['global_step']:>6} "
              f"{r['every_sample_once']!s:>5}  {worlds}")  # fmt: skip
    print(f"new node: first update {churn['join_to_first_update_s']:.1f} s after its agent started")
    for change in churn["changes"]:
        print(f"{change['change']}: {change['updates_lost']} updates lost, "
              f"{change['seconds_without_training']:.1f} s without training")  # fmt: skip
    print(f"accuracy churn - undisturbed: {100 * (churn['val_acc'] - undisturbed['val_acc']):+.2f} points")
    payload = {"args": vars(args), "host": platform.node(), "results": results}
    RESULTS.mkdir(exist_ok=True)
    write_json(RESULTS / args.out, payload)
