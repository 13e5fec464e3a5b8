"""Elastic local SGD (``ElasticLocalSGDStrategy``) with workers that leave and join, against the job undisturbed.
4 workers of speeds 1, 1, 2, 4; runs ``undisturbed``, ``churn`` (a worker killed and restarted every epoch) and
``join``; ``--soak N``: N kill-and-restart cycles.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.elastic_job import ElasticJob
from benchmarks.harness.launch import RESULTS, wait_for
from benchmarks.harness.record import write_json

SPEEDS = {"a": 1.0, "b": 1.0, "c": 2.0, "d": 4.0}
#: a speed-1 worker's step sleep, or its CPU quota (``--throttle quota``)
BASE_STEP_S, BASE_QUOTA = 0.3, 0.125
#: a kill comes this long into an epoch, plus a seeded random delay up to the jitter
KILL_DELAY_S, KILL_JITTER_S = 5.0, 3.0
KILLED, ADDED = "b", "e"

#: why ``--grid`` does not apply
NO_GRID = "its figures are correctness (batches lost or duplicated) and start-up times, not a tuned throughput"


def _epoch_of_latest_commit(job: ElasticJob) -> int:
    commits = job.commits()
    return commits[-1]["epoch"] if commits else -1


def run(kind: str, args: argparse.Namespace, seed: int, out: Path) -> dict[str, Any]:
    common = [
        "--epochs", str(args.epochs), "--samples", str(args.samples), "--batch-size", str(args.batch_size),
        "--noise", str(args.noise), "--classes", "8", "--seed", str(seed), "--hidden", "64",
        "--round-length", "16",  # the strategy's default (the worker script's is 4, for short tests)
    ]  # fmt: skip
    job = ElasticJob(out, common)
    speed_args = {name: _speed_args(args, speed) for name, speed in SPEEDS.items()}
    kill_at = random.Random(seed)
    restarts: list[int] = []
    try:
        job.start("a", *speed_args["a"], host=True)
        for name in ("b", "c", "d"):
            job.start(name, *speed_args[name])
        if kind == "churn":
            for epoch in range(args.epochs):
                # the middle of the epoch: its first commits seen, then half an epoch's time (estimated) on
                if not wait_for(lambda e=epoch: _epoch_of_latest_commit(job) >= e, 300):
                    break
                time.sleep(KILL_DELAY_S + kill_at.uniform(0, KILL_JITTER_S))
                if _epoch_of_latest_commit(job) != epoch:
                    continue
                job.kill(KILLED)
                restarts.append(job.start(KILLED, *speed_args[KILLED]).pid)
        elif kind == "join":
            wait_for(lambda: _epoch_of_latest_commit(job) >= args.epochs // 2, 300)
            restarts.append(job.start(ADDED, *speed_args["a"]).pid)
        codes = job.wait(timeout_s=600)
    finally:
        job.close()
    commits = job.commits()
    num_chunks = -(-args.samples // args.batch_size)
    try:
        coverage, history_error = job.coverage(num_chunks), None
    except (AssertionError, ValueError) as err:  # no history to count: the run failed (reported)
        coverage, history_error = {}, str(err)
    results = {r["name"]: r for r in job.results()}
    span_s = commits[-1]["t"] - commits[0]["t"]
    reports = {name: r["report"] for name, r in results.items()}
    return {
        "run": kind, "seed": seed, "exit_codes": codes, "samples_per_s": args.epochs * args.samples / span_s,
        "val_acc": results["a"]["val_acc"] if "a" in results else float("nan"), "logs": str(out),
        "first_contribution_s": [job.first_contribution_s(pid) for pid in restarts],
        "start_up": [job.start_up(pid) for pid in restarts],
        "lost_per_epoch": [c["lost"] for c in coverage.values()],
        "duplicated_per_epoch": [c["duplicated"] for c in coverage.values()],
        "failed_rounds": {name: r["failed_rounds"] for name, r in reports.items()},
        "diverged_rounds": {name: r.get("diverged_rounds", 0) for name, r in reports.items()},
        "participants_per_round": _participants_per_round(commits),
        "round_end_ms": {name: 1000 * r["round_end_s"] / max(1, r["round_ends"]) for name, r in reports.items()},
        "errors": job.errors(), "history_error": history_error,
    }  # fmt: skip


def _participants_per_round(commits: list[dict[str, Any]]) -> dict[int, int]:
    """Committed rounds by the number of workers that logged them (torchft steps; a worker left out logs none)."""
    per_step: dict[int, set[int]] = {}
    for row in commits:
        per_step.setdefault(row["step"], set()).add(row["pid"])
    counts: dict[int, int] = {}
    for pids in per_step.values():
        counts[len(pids)] = counts.get(len(pids), 0) + 1
    return dict(sorted(counts.items()))


def _speed_args(args: argparse.Namespace, speed: float) -> list[str]:
    if args.throttle == "sleep":
        return ["--step-sleep-s", f"{BASE_STEP_S / speed:g}"]
    return ["--spin-s", f"{BASE_STEP_S * BASE_QUOTA:g}", "--cpu-quota", f"{BASE_QUOTA * speed:g}"]


def soak(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One job through ``args.soak`` kill-and-restart cycles of one worker; every process must end."""
    stop = out / "stop"
    common = ["--epochs", "100000", "--samples", "2048", "--batch-size", "16", "--step-sleep-s", "0.02"]
    common += ["--round-length", "16"]  # the strategy's default
    job = ElasticJob(out, [*common, "--stop-file", str(stop)])
    contributions: list[float | None] = []
    try:
        job.start("a", host=True)
        job.start("c")
        victim = job.start("b")
        for _ in range(args.soak):
            wait_for(lambda p=victim: job.first_contribution_s(p.pid) is not None, 120)
            contributions.append(job.first_contribution_s(victim.pid))
            job.kill("b")
            victim = job.start("b")
        wait_for(lambda p=victim: job.first_contribution_s(p.pid) is not None, 120)
        contributions.append(job.first_contribution_s(victim.pid))
        stop.write_text(str(_epoch_of_latest_commit(job) + 2))
        codes = job.wait(timeout_s=300)
    finally:
        job.close()
    coverage = job.coverage(2048 // 16)  # the job's history (the stop comes at an epoch's end)
    complete = list(coverage.values())
    return {
        "cycles": args.soak, "exit_codes": codes,
        "hangs": sum(code is None for codes_ in codes.values() for code in codes_),
        "first_contribution_s": contributions, "epochs": len(coverage), "lost": sum(c["lost"] for c in complete),
        "duplicated": sum(c["duplicated"] for c in complete), "errors": job.errors(),
    }  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--out", default=None, help="the JSON's name in results/ (elastic.json, elastic_soak.json)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=6400)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--noise", type=float, default=2.0)
    parser.add_argument("--throttle", choices=["sleep", "quota"], default="sleep", help="how speeds are emulated")
    parser.add_argument("--soak", type=int, default=0, help="run N kill-and-restart cycles instead")
    parser.add_argument("--runs", default="undisturbed,churn,join", help="which runs, comma-separated")


def main(args: argparse.Namespace) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout's TERM still stops the workers (finally)
    RESULTS.mkdir(exist_ok=True)
    conditions = {"speeds": SPEEDS}
    if args.soak:
        with tempfile.TemporaryDirectory() as tmp:
            report = soak(args, Path(tmp))
        print(f"soak: {report['cycles']} kill-and-restart cycles, hangs {report['hangs']}, epochs {report['epochs']}, "
              f"lost {report['lost']}, duplicated {report['duplicated']}, first contribution s "
              f"median {statistics.median(c for c in report['first_contribution_s'] if c is not None):.1f} "
              f"max {max(c for c in report['first_contribution_s'] if c is not None):.1f}")  # fmt: skip
        write_json(RESULTS / (args.out or "elastic_soak.json"), {"conditions": conditions, **report})
        return
    runs = []
    for seed in range(args.seeds):
        for kind in args.runs.split(","):
            out = Path(tempfile.mkdtemp(prefix=f"elastic-{kind}-"))  # kept: the workers' logs, for a failed run
            runs.append(run(kind, args, seed, out))
            print(json.dumps(runs[-1]), flush=True)
    summary = {}
    for kind in args.runs.split(","):
        rows = [r for r in runs if r["run"] == kind]
        firsts = [c for r in rows for c in r["first_contribution_s"]]
        summary[kind] = {
            "samples_per_s": statistics.median(r["samples_per_s"] for r in rows),
            "val_acc": statistics.median(r["val_acc"] for r in rows),
            "first_contribution_s": sorted(c for c in firsts if c is not None),
            "first_contribution_s_max": max((c for c in firsts if c), default=None),
            "restarts_without_contribution": sum(c is None for c in firsts),
            "lost": sum(sum(r["lost_per_epoch"]) for r in rows),
            "duplicated": sum(sum(r["duplicated_per_epoch"]) for r in rows),
        }
    base = summary.get("undisturbed", next(iter(summary.values())))
    print(
        f"{'run':12} {'samples/s':>10} {'ratio':>6} {'val_acc':>8} {'d acc pt':>8} {'1st med/max s':>14} "
        f"{'lost':>5} {'dup':>4}"
    )
    for kind, row in summary.items():
        row["throughput_ratio"] = row["samples_per_s"] / base["samples_per_s"]
        row["accuracy_delta_points"] = 100 * (row["val_acc"] - base["val_acc"])
        firsts = row["first_contribution_s"]
        first = f"{statistics.median(firsts):.1f}/{max(firsts):.1f}" if firsts else "-"
        print(f"{kind:12} {row['samples_per_s']:10.1f} {row['throughput_ratio']:6.2f} {row['val_acc']:8.4f} "
              f"{row['accuracy_delta_points']:8.2f} {first:>14} {row['lost']:5d} {row['duplicated']:4d}")  # fmt: skip
    write_json(RESULTS / (args.out or "elastic.json"), {"conditions": conditions, "summary": summary, "runs": runs})
