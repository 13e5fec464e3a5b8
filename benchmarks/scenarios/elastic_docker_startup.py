"""An elastic worker's start-up under a real Docker CPU quota (``docker run --cpus Q``), beside 3 workers on the host.
Seconds to a (re)started worker's imports, first round end and first contribution.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.elastic_job import ElasticJob
from benchmarks.harness.launch import RESULTS, ROOT, wait_for
from benchmarks.harness.record import write_json
from benchmarks.harness.stats import median

COMMON = ["--epochs", "1000", "--samples", "4800", "--batch-size", "16", "--noise", "2.0", "--classes", "8"]
COMMON += ["--seed", "0", "--hidden", "64", "--round-length", "16"]
SLEEP = {"a": 0.3, "c": 0.15, "d": 0.075, "new": 0.3}  # a speed-1 step sleeps 0.3 s

#: why ``--grid`` does not apply
NO_GRID = "it measures start-up time at the quotas it is given (--cpus is its grid)"


def _docker(image: str, cpus: str, name: str, out: Path) -> list[str]:
    """``docker run`` words up to the interpreter: this worktree, ``out`` and the host's site-packages mounted."""
    site = sysconfig.get_paths()["purelib"]
    command = ["docker", "run", "--rm", "--name", name, "--network", "host"]
    command += [] if cpus == "none" else ["--cpus", cpus]
    command += ["-v", f"{ROOT}:{ROOT}:ro", "-v", f"{out}:{out}", "-v", f"{site}:{site}:ro"]
    command += ["-e", f"PYTHONPATH={ROOT / 'src'}:{site}", "-e", "PYTHONUNBUFFERED=1", image, "python"]
    return command


def _empty_container_s(image: str, cpus: str) -> float:
    command = ["docker", "run", "--rm"] + ([] if cpus == "none" else ["--cpus", cpus]) + [image, "python", "-c", "pass"]
    start = time.monotonic()
    subprocess.run(command, check=True, capture_output=True)
    return time.monotonic() - start


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cpus", default="none,1.0,0.5,0.25", help="the containers' quotas (none: no quota)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--image", default="lightning-hetero-worker:latest")
    parser.add_argument("--out", default="elastic_docker_startup.json", help="the JSON's name in results/")


def main(args: argparse.Namespace) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout's TERM still stops the workers (finally)
    quotas = args.cpus.split(",")
    out = Path(tempfile.mkdtemp(prefix="elastic-docker-"))
    job = ElasticJob(out, COMMON)
    job_text = "a (lighthouse), c, d on the host, step sleeps 0.3, 0.15, 0.075 s; the started worker 0.3 s; "
    conditions = {"job": job_text + " ".join(COMMON), "logs": str(out)}
    empty = {cpus: _empty_container_s(args.image, cpus) for cpus in quotas}
    starts: list[dict[str, Any]] = []
    containers: list[str] = []
    try:
        host = job.start("a", "--step-sleep-s", str(SLEEP["a"]), host=True).pid
        for name in "cd":
            job.start(name, "--step-sleep-s", str(SLEEP[name]))
        if not wait_for(lambda: sum(row["pid"] == host for row in job.commits()) >= 4, 120):
            raise RuntimeError(f"the job did not commit 4 rounds within 120 s: {job.errors()}")
        plan = [("host", 0)] + [(cpus, i) for cpus in quotas for i in range(args.repeats)]
        for index, (cpus, repeat) in enumerate(plan):
            name = f"n{index}"
            launcher = None
            if cpus != "host":
                containers.append(f"lh-elastic-{os.getpid()}-{name}")
                launcher = _docker(args.image, cpus, containers[-1], out)
            proc = job.start(name, "--step-sleep-s", str(SLEEP["new"]), launcher=launcher)
            wait_for(lambda n=name: job.start_up(name=n)["first_contribution_s"] is not None, 180)
            starts.append({"cpus": cpus, "repeat": repeat, "name": name, **job.start_up(name=name)})
            print(json.dumps(starts[-1]), flush=True)
            _write(args.out, conditions, _summary(["host", *quotas], starts, empty, quiet=True), starts, job)
            if cpus == "host":
                job.kill(name)
            else:
                subprocess.run(["docker", "rm", "-f", containers[-1]], capture_output=True)
                proc.wait(timeout=30)
            time.sleep(3.0)  # the job drops the killed worker (heartbeat_timeout_s=2) before the next start
    finally:
        for name in containers:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True)
        job.close()
    summary = _summary(["host", *quotas], starts, empty)
    _write(args.out, conditions, summary, starts, job)


def _write(out: str, conditions: dict, summary: dict, starts: list, job: ElasticJob) -> None:
    write_json(RESULTS / out, {"conditions": conditions, "summary": summary, "starts": starts, "errors": job.errors()})


def _summary(kinds: list[str], starts: list[dict], empty: dict[str, float], quiet: bool = False) -> dict:
    summary = {}
    if not quiet:
        print(f"{'cpus':>6} {'empty ctr s':>11} {'imports s':>10} {'joined s':>9} {'1st contribution s':>19}")
    for cpus in kinds:
        rows = [row for row in starts if row["cpus"] == cpus]
        medians = {key: median(row[key] for row in rows) for key in ("imported_s", "joined_s", "first_contribution_s")}
        summary[cpus] = {**medians, "empty_container_s": empty.get(cpus)}
        summary[cpus]["no_contribution"] = sum(row["first_contribution_s"] is None for row in rows)
        if not quiet and rows:
            firsts = ", ".join(f"{row['first_contribution_s']:.1f}" for row in rows if row["first_contribution_s"])
            print(f"{cpus:>6} {empty.get(cpus, 0.0):11.1f} {medians['imported_s'] or 0:10.1f} "
                  f"{medians['joined_s'] or 0:9.1f} {firsts:>19}")  # fmt: skip
    return summary
