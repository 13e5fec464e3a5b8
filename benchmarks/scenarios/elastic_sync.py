"""Synchronous elastic HeteroBatch (``ElasticHeteroBatchStrategy`` on torchft) with workers that leave and join.

Four workers (``examples/elastic/elastic_worker.py --sync``) at speeds 1, 1, 2, 4 (a sleep per sample), undisturbed
and under ``churn``: a speed-1 worker SIGKILLed and restarted half-way through every epoch, a fifth added half-way.

Usage: python -m benchmarks run elastic_sync [--seeds 1] [--epochs 4] [--out NAME.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.elastic_job import SYNC, ElasticJob
from benchmarks.harness.launch import RESULTS, wait_for
from benchmarks.harness.record import table, write_json

SPEEDS = {"a": 1.0, "b": 1.0, "c": 2.0, "d": 4.0}
KILLED, ADDED = "b", "e"

#: why ``--grid`` does not apply
NO_GRID = "its figures are correctness (the global batch per step, samples lost or duplicated) and start-up times"


def _host_steps(job: ElasticJob) -> list[dict[str, Any]]:
    return [row for row in job.commits() if row["name"] == "a"]


def run(kind: str, args: argparse.Namespace, seed: int, out: Path) -> dict[str, Any]:
    stop = out / "stop"
    stop.write_text(str(args.epochs))
    common = ["--samples", str(args.samples), "--batch-size", str(args.batch_size), "--seed", str(seed)]
    job = ElasticJob(out, [*SYNC, *common, "--stop-file", str(stop)])
    speed = {name: ["--sample-sleep-s", str(args.base_sample_s / s)] for name, s in {**SPEEDS, ADDED: 1.0}.items()}
    chunks = -(-args.samples // args.batch_size)
    joined: list[int] = []
    try:
        job.start("a", *speed["a"], host=True)
        for name in ("b", "c", "d"):
            job.start(name, *speed[name])
        for epoch in range(args.epochs if kind == "churn" else 0):
            middle = lambda e=epoch: sum(row["epoch"] == e for row in _host_steps(job)) >= chunks // 2  # noqa: E731
            contributed = lambda: (  # noqa: E731
                not joined or job.first_contribution_s(joined[0]) is not None or job.procs["a"][0].poll() is not None
            )
            if not (wait_for(middle, args.timeout_s) and wait_for(contributed, args.timeout_s)):
                break
            job.kill(KILLED)
            joined.insert(0, job.start(KILLED, *speed[KILLED]).pid)
            if epoch == args.epochs // 2:
                joined.append(job.start(ADDED, *speed[ADDED]).pid)  # last: the next kill waits for the restart
        codes = job.wait(timeout_s=args.timeout_s)
    finally:
        job.close()
    history = job.history()
    sizes = [min(args.batch_size, args.samples - c * args.batch_size) for c in range(chunks)]
    coverage = job.coverage(chunks)
    host = _host_steps(job)
    results = {r["name"]: r for r in job.results()}
    return {
        "run": kind, "seed": seed, "exit_codes": codes,
        "samples_per_s": sum(row["samples"] for row in host[1:]) / (host[-1]["t"] - host[0]["t"]),
        "val_acc": results["a"]["val_acc"], "steps": len(history),
        "steps_not_the_global_batch": sum(r.samples != sizes[r.round_chunks[0]] for r in history),
        "lost_per_epoch": [c["lost"] for c in coverage.values()],
        "duplicated_per_epoch": [c["duplicated"] for c in coverage.values()],
        "first_contribution_s": [job.first_contribution_s(pid) for pid in joined],
        "failed_steps": {name: r["report"]["failed_steps"] for name, r in results.items()},
        "logs": str(out), "errors": job.errors(),
    }  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--out", default=None, help="the JSON's name in results/ (elastic_sync.json)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--batch-size", type=int, default=128, help="the global batch")
    parser.add_argument("--base-sample-s", type=float, default=0.004, help="a speed-1 worker's sleep per sample")
    parser.add_argument("--timeout-s", type=float, default=600, help="for each wait (a run never hangs)")


def main(args: argparse.Namespace) -> None:
    runs = []
    for seed in range(args.seeds):
        for kind in ("undisturbed", "churn"):
            out = Path(tempfile.mkdtemp(prefix=f"elastic-sync-{kind}-"))  # kept: the workers' logs
            runs.append(run(kind, args, seed, out))
            print(json.dumps(runs[-1]), flush=True)
    summary = {}
    for kind in ("undisturbed", "churn"):
        rows = [r for r in runs if r["run"] == kind]
        firsts = [c for r in rows for c in r["first_contribution_s"] if c is not None]
        summary[kind] = {
            "samples_per_s": statistics.median(r["samples_per_s"] for r in rows),
            "val_acc": statistics.median(r["val_acc"] for r in rows),
            "steps": sum(r["steps"] for r in rows),
            "steps_not_the_global_batch": sum(r["steps_not_the_global_batch"] for r in rows),
            "lost": sum(sum(r["lost_per_epoch"]) for r in rows),
            "duplicated": sum(sum(r["duplicated_per_epoch"]) for r in rows),
            "first_contribution_s_max": max(firsts, default=None),
        }
    formats = ["", ".1f", ".4f", "", "", "", "", ".1f"]
    header = ["run", "samples/s", "val_acc", "steps", "not B", "lost", "dup", "1st s max"]
    print(table(header, [[kind, *row.values()] for kind, row in summary.items()], formats))
    summary["churn"]["throughput_ratio"] = summary["churn"]["samples_per_s"] / summary["undisturbed"]["samples_per_s"]
    conditions = {**vars(args), "speeds": SPEEDS, "added": ADDED, "killed": KILLED}
    path = RESULTS / (args.out or "elastic_sync.json")
    write_json(path, {"conditions": conditions, "summary": summary, "runs": runs})
