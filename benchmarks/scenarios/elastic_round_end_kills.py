"""Kills aimed at an elastic job's round ends: how long a restarted worker takes to contribute when its kill breaks
a round end (the case ``bench_elastic.py``'s randomly timed kills rarely hit).

Four workers as in ``bench_elastic.py`` (sleep-emulated speeds 1, 1, 2, 4, a speed-1 step sleeping 0.3 s, 6,400
samples in batches of 16, the strategy's defaults); for each OFFSET, worker ``b`` is SIGKILLed OFFSET seconds after
the host's next commit (a round lasts about 2.5 s, so offsets near it land in the next round end) and started again
at once. Prints and writes, per kill, the restarted worker's start-up (imports, joined, first contribution) and the
host's commit times around the kill (a gap of more than a round: the kill broke a round end), and the batches lost
and duplicated per epoch in the job's history up to the host's last commit (the last epoch is cut short by the stop).

Usage: python -m benchmarks run elastic_round_end_kills [OFFSET,...] [--out NAME.json]
(offsets default 2.3,2.4,2.45,2.5,2.55,2.6; the JSON default elastic_28b_round_end_kills.json)
"""

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.elastic_job import ElasticJob, wait_for
from benchmarks.harness.launch import RESULTS as RESULTS_DIR

RESULTS = RESULTS_DIR
SPEEDS = {"a": 1.0, "b": 1.0, "c": 2.0, "d": 4.0}
COMMON = ["--epochs", "1000", "--samples", "6400", "--batch-size", "16", "--noise", "2.0", "--classes", "8"]
COMMON += ["--seed", "0", "--hidden", "64", "--steps-per-round", "16"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("offsets", nargs="?", default="2.3,2.4,2.45,2.5,2.55,2.6")
    parser.add_argument("--out", default="elastic_28b_round_end_kills.json", help="the JSON's name in results/")


def main(args: argparse.Namespace) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout's TERM still stops the workers
    offsets = [float(x) for x in args.offsets.split(",")]
    job = ElasticJob(Path(tempfile.mkdtemp(prefix="elastic-round-end-")), COMMON)
    speed = {name: ["--step-sleep-s", f"{0.3 / s:g}"] for name, s in SPEEDS.items()}
    kills = []
    try:
        host = job.start("a", *speed["a"], host=True).pid
        for name in "bcd":
            job.start(name, *speed[name])

        def host_commits() -> list[dict]:
            return [row for row in job.commits() if row["pid"] == host]

        wait_for(lambda: len(host_commits()) >= 6, 60.0, poll_s=0.005)
        for offset in offsets:
            seen = len(host_commits())
            wait_for(lambda n=seen: len(host_commits()) > n, 60.0, poll_s=0.005)
            time.sleep(offset)
            killed_at = time.time()
            job.kill("b")
            proc = job.start("b", *speed["b"])
            wait_for(lambda p=proc: job.first_contribution_s(p.pid) is not None, 40, poll_s=0.005)
            time.sleep(0.5)
            around = [round(r["t"] - killed_at, 2) for r in host_commits() if -3 < r["t"] - killed_at < 15]
            kills.append({"offset": offset, "start_up": job.start_up(proc.pid), "a_commits_since_kill": around})
            print(json.dumps(kills[-1]), flush=True)
    finally:
        job.close()
    coverage = job.coverage(6400 // 16, pid=host)
    print("lost / duplicated per epoch:", [(c["lost"], c["duplicated"]) for c in coverage.values()], flush=True)
    conditions = {"offsets": offsets, "speeds": SPEEDS, "worker_args": COMMON, "errors": job.errors()}
    out = {"conditions": conditions, "kills": kills, "coverage_per_epoch": coverage}
    (RESULTS / args.out).write_text(json.dumps(out))
