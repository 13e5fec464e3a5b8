"""An elastic local-SGD job in the emulated cluster's containers, with churn scripted by ``lightning-hetero cluster``.

``lightning-hetero cluster up`` starts three containers of the worker image (``--image``; it must have the
``elastic`` extra, as ``docker/build-image.sh`` builds it) with no CPU limits, each running one worker of
``elastic_worker.py`` as its main process: the cluster's ``cluster.command``, written with the rest of the cluster's
settings to ``cluster.yaml`` in the progress directory. The worker script is copied there too (every container
mounts that directory at ``/progress``; the image holds the package, not ``benchmarks/``). The first container
(``NODE_RANK=0``) hosts torchft's lighthouse; sleep-emulated speeds 1, 2, 1 (a speed-1 step sleeps 0.15 s); 4,800
samples in batches of 16, ``--epochs`` epochs, the strategy's defaults. A worker's name is its container's start
time and the container's name: a restarted container's worker is a new process with a log of its own (every
process in a container of its own is pid 1, so the name tells them apart).

Once every worker has contributed, ``lightning-hetero cluster churn --workers elastic3 --every-s E --down-s D
--cycles N`` kills the third container (SIGKILL, a machine lost) every E seconds and starts it again D seconds later;
its command runs again and the new worker joins the running job. Read from the workers' commit logs: per container
start, seconds from the start (the container's shell, before Python) to the end of the worker's imports, to its
first round end (joined: the state fetched) and to its first committed round that trained a batch (its first
contribution); per epoch of the job's history, batches lost and duplicated; the job's end (each container's exit
code, every finishing worker's epochs, accuracy and parameter checksum). ``lightning-hetero cluster down`` removes
the containers at the end (also after a failure).

Prints a table and writes ``benchmarks/results/elastic_28h_docker_churn.json`` (``--out`` names another).

Usage: python -m benchmarks run elastic_docker_churn [--image IMAGE] [--epochs 6] [--every-s 20] [--down-s 3]
[--cycles 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.elastic_job import WORKER, ElasticJob, wait_for
from benchmarks.harness.launch import RESULTS as RESULTS_DIR
from benchmarks.harness.launch import ROOT as ROOT_DIR

RESULTS = RESULTS_DIR
ROOT = ROOT_DIR
CONTAINERS = ["elastic1", "elastic2", "elastic3"]
CHURNED = "elastic3"
NETWORK = "lightning-hetero-elastic"
LIGHTHOUSE = f"http://{CONTAINERS[0]}:29510"
SAMPLES, BATCH = 4800, 16
OPTIONS = f"--samples {SAMPLES} --batch-size {BATCH} --noise 2.0 --classes 8 --hidden 64 --seed 0"


def worker_command(epochs: int) -> list[str]:
    """The containers' main process: one elastic worker, named by its start time and container (no ``${...}``: the
    configuration would read it as an interpolation)."""
    script = (
        'S=$(date +%s.%N); T=$(date +%s); case "$NODE_RANK" in 0) set -- --start-lighthouse --step-sleep-s 0.15 ;; '
        "1) set -- --step-sleep-s 0.075 ;; *) set -- --step-sleep-s 0.15 ;; esac; "
        f"exec python /progress/elastic_worker.py /progress/job --lighthouse {LIGHTHOUSE} "
        f'--name "$T-$HOSTNAME" --started-at "$S" --epochs {epochs} {OPTIONS} "$@"'
    )
    return ["sh", "-c", script]


def cli() -> list[str]:
    """The ``lightning-hetero`` command of this interpreter's environment."""
    found = shutil.which("lightning-hetero", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", "lightning_hetero.emulation.cli"]


def run(command: list[str], log: list[str]) -> None:
    log.append(" ".join(command))
    print("$", log[-1], flush=True)
    subprocess.run(command, check=True)


def starts(job: ElasticJob) -> list[dict[str, Any]]:
    """Per worker process (one per container start): its start-up, from its commit log."""
    by_name: dict[str, list[dict]] = {}
    for row in job.commits():
        by_name.setdefault(row["name"], []).append(row)
    rows = []
    for name, commits in sorted(by_name.items()):
        contributed = [row["since_start_s"] for row in commits if row["chunks"]]
        rows.append(
            {
                "container": name.split("-", 1)[1],
                "name": name,
                "started_at": commits[0]["t"] - commits[0]["since_start_s"],
                "imported_s": commits[0]["imported_s"],
                "joined_s": next((row["joined_s"] for row in commits if "joined_s" in row), None),
                "first_contribution_s": contributed[0] if contributed else None,
                "commits": len(commits),
            }
        )
    return sorted(rows, key=lambda row: row["started_at"])


def exit_codes(names: list[str], timeout_s: float) -> dict[str, Any]:
    """Wait until no container runs (the job ended); their exit codes (``None``: still running at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = {}
        for name in names:
            inspect = subprocess.run(
                ["docker", "inspect", "-f", "{{.State.Running}} {{.State.ExitCode}}", name],
                capture_output=True,
                text=True,
            )
            running, code = inspect.stdout.split() if inspect.returncode == 0 else ("false", "-1")
            states[name] = None if running == "true" else int(code)
        if all(code is not None for code in states.values()) or time.monotonic() > deadline:
            return states
        time.sleep(1.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image", default="lightning-hetero-worker:latest")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--every-s", type=float, default=20.0)
    parser.add_argument("--down-s", type=float, default=3.0)
    parser.add_argument("--cycles", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="the job's end is waited for this long")
    parser.add_argument("--out", default="elastic_28h_docker_churn.json", help="the JSON's name in results/")


def main(args: argparse.Namespace) -> None:
    progress = Path(tempfile.mkdtemp(prefix="elastic-docker-churn-"))
    progress.chmod(0o777)  # the containers' user writes the job's logs here
    shutil.copy(WORKER, progress / "elastic_worker.py")
    job = ElasticJob(progress / "job", [], lighthouse=LIGHTHOUSE)
    (progress / "job").chmod(0o777)
    config = progress / "cluster.yaml"
    cluster = {"image": args.image, "network": NETWORK, "command": worker_command(args.epochs)}
    config.write_text(yaml.safe_dump({"containers": CONTAINERS, "progress_dir": str(progress), "cluster": cluster}))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    conditions = {
        **vars(args),
        "commit": commit.stdout.strip(),
        "load_avg_at_start": os.getloadavg(),
        "host_cpus": os.cpu_count(),
        "cluster_yaml": config.read_text(),
        "logs": str(progress),
    }
    commands: list[str] = []
    started = time.time()
    try:
        run([*cli(), "cluster", "up", "-c", str(config)], commands)
        contributed = lambda: {row["container"] for row in starts(job) if row["first_contribution_s"]}  # noqa: E731
        if not wait_for(lambda: contributed() == set(CONTAINERS) or bool(job.errors()), 180, 0.5) or job.errors():
            raise RuntimeError(f"not every worker contributed within 180 s: {job.errors()}")
        churn = ["cluster", "churn", "--workers", CHURNED, "--every-s", f"{args.every_s:g}"]
        churn += ["--down-s", f"{args.down_s:g}", "--cycles", str(args.cycles)]
        run([*cli(), *churn], commands)
        codes = exit_codes(CONTAINERS, args.timeout_s)
    finally:
        for name in CONTAINERS:
            logs = subprocess.run(["docker", "logs", name], capture_output=True, text=True)
            (progress / f"{name}.log").write_text(logs.stdout + logs.stderr)
        run([*cli(), "cluster", "down", "-c", str(config)], commands)
    try:
        coverage, history_error = job.coverage(-(-SAMPLES // BATCH)), None
    except (AssertionError, ValueError) as err:  # no history to count: the run failed (reported)
        coverage, history_error = {}, str(err)
    commits = job.commits()
    processes = starts(job)
    restarts = [row for row in processes if row["container"] == CHURNED][1:]
    results = job.results()
    report = {
        "conditions": {**conditions, "load_avg_at_end": os.getloadavg(), "commands": commands},
        "starts": processes,
        "restarts_first_contribution_s": [row["first_contribution_s"] for row in restarts],
        "lost_per_epoch": [c["lost"] for c in coverage.values()],
        "duplicated_per_epoch": [c["duplicated"] for c in coverage.values()],
        "history_error": history_error,
        "end": {
            "exit_codes": codes,
            "wall_s": time.time() - started,
            "samples_per_s": args.epochs * SAMPLES / (commits[-1]["t"] - commits[0]["t"]) if commits else None,
            "steps": max((row["step"] for row in commits), default=0),
            "workers": [
                {key: r[key] for key in ("name", "epochs", "val_acc", "checksum", "wall_s")}
                | {"failed_rounds": r["report"].get("failed_rounds"), "diverged": r["report"].get("diverged_rounds")}
                for r in results
            ],
        },
        "errors": job.errors(),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / args.out).write_text(json.dumps(report, indent=1))
    print(
        f"{'container':10} {'started s':>9} {'imports s':>9} {'joined s':>8} {'1st contribution s':>18} {'commits':>7}"
    )
    for row in processes:
        widths = {"imported_s": 9, "joined_s": 8, "first_contribution_s": 18}
        shown = " ".join(f"{'-' if row[k] is None else f'{row[k]:.1f}':>{w}}" for k, w in widths.items())
        print(f"{row['container']:10} {row['started_at'] - started:9.1f} {shown} {row['commits']:7d}")
    print(f"lost per epoch {report['lost_per_epoch']}, duplicated per epoch {report['duplicated_per_epoch']}")
    print(f"exit codes {codes}; workers finished: {[(r['name'], r['epochs'], r['val_acc']) for r in results]}")
    print(f"errors {report['errors'] or 'none'}; history {history_error or 'complete'}; JSON {RESULTS / args.out}")
