"""An elastic job on this machine: ``examples/elastic/elastic_worker.py`` processes started, killed and restarted at
will, and what they wrote read back (the elastic scenarios and ``tests/elastic/``)."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.harness.launch import free_port, spawn, stop
from lightning_hetero.elastic.commits import CommitRecord, epoch_coverage, lineage

WORKER = Path(__file__).resolve().parents[1] / "examples" / "elastic" / "elastic_worker.py"
#: the worker's options for a synchronous job (``ElasticHeteroBatchStrategy``), which ends at its ``--stop-file``
SYNC = ["--sync", "--epochs", "1000", "--hidden", "16", "--step-timeout-s", "30"]


class ElasticJob:
    """Workers of one job writing into ``out``; ``args`` go to every worker; ``lighthouse``: default a free local
    port, started by the worker started with ``host=True``."""

    def __init__(self, out: Path, args: list[str], lighthouse: str | None = None) -> None:
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.args = list(args)
        self.lighthouse = lighthouse or f"http://localhost:{free_port()}"
        #: every process started, by worker name, oldest first
        self.procs: dict[str, list[subprocess.Popen]] = collections.defaultdict(list)
        #: when each process was started (``time.time()``), by pid
        self.started_at: dict[int, float] = {}

    def start(self, name: str, *args: str, host: bool = False, launcher: list[str] | None = None) -> subprocess.Popen:
        """Start worker ``name`` (``host``: it starts the lighthouse) with ``args`` after the job's; ``launcher``
        replaces ``[sys.executable]`` (e.g. ``docker run ... python``: the worker's and ``out``'s paths must be the
        same inside, and its commit log then carries the container's pid: see ``name`` in :meth:`commits`)."""
        started_at = time.time()
        command = [*(launcher or [sys.executable]), str(WORKER), str(self.out), "--lighthouse", self.lighthouse]
        command += ["--name", name]
        command += [*self.args, *args, "--started-at", repr(started_at)]
        if host:
            command.append("--start-lighthouse")
        proc = spawn(command, self.out / f"{name}.log", {**os.environ, "PYTHONUNBUFFERED": "1"})
        self.procs[name].append(proc)
        self.started_at[proc.pid] = started_at
        return proc

    def kill(self, name: str) -> None:
        """SIGKILL the running process of worker ``name``."""
        stop(self.procs[name][-1])

    def wait(self, timeout_s: float) -> dict[str, list[int | None]]:
        """Wait for every process (killing those still running after ``timeout_s``: returncode ``None``)."""
        deadline = time.monotonic() + timeout_s
        return {
            name: [stop(proc, max(0.1, deadline - time.monotonic())) for proc in procs]
            for name, procs in self.procs.items()
        }

    def close(self) -> None:
        for procs in self.procs.values():
            for proc in procs:
                stop(proc)

    def waiting(self) -> int:
        """Workers waiting at the lighthouse for a round end's quorum (from its status page; the lighthouse's host
        must be running)."""
        with urllib.request.urlopen(f"{self.lighthouse}/status", timeout=5) as response:
            status = response.read().decode()
        found = re.search(r"\[(\d+)/\d+ participants healthy\]", status)
        if found is None:
            raise AssertionError(f"no participant count on the lighthouse's status page: {status[:300]!r}")
        return int(found.group(1))

    def commits(self) -> list[dict[str, Any]]:
        """Every worker's committed rounds (a ``CommitRecord``'s fields, ``t``, ``since_start_s``, ``pid``,
        ``name``)."""
        rows = []
        for path in self.out.glob("commits-*.jsonl"):
            name, pid = path.stem.removeprefix("commits-").rsplit("-", 1)
            lines = [line for line in path.read_text().splitlines() if line.strip()]
            rows += [{**json.loads(line), "pid": int(pid), "name": name} for line in lines]
        return sorted(rows, key=lambda row: row["t"])

    def history(self, pid: int | None = None) -> list[CommitRecord]:
        """The job's history: the commits the parameters of the workers that finished descend from (they must agree
        on the last one), from every worker's log; with ``pid``, those worker ``pid``'s last commit descends from (a
        job stopped before any worker finished). A process is its worker's name and pid: processes in containers
        of their own have the same pids."""
        fields = {field.name for field in dataclasses.fields(CommitRecord)}
        by_process: dict[tuple[str, int], list[CommitRecord]] = collections.defaultdict(list)
        for row in self.commits():
            values = {k: tuple(v) if isinstance(v, list) else v for k, v in row.items() if k in fields}
            by_process[row["name"], row["pid"]].append(CommitRecord(**values))
        finished = set()
        for path in self.out.glob("worker-*.json"):
            name, process = path.stem.removeprefix("worker-").rsplit("-", 1)
            finished.add((name, int(process)))
        if pid is not None:
            finished = {key for key in by_process if key[1] == pid}
        finals = {(records[-1].step, records[-1].digest) for key, records in by_process.items() if key in finished}
        if len(finals) != 1:
            raise AssertionError(f"the workers that finished end at different commits: {sorted(finals)}")
        final = next(records[-1] for key, records in by_process.items() if key in finished)
        return lineage([record for records in by_process.values() for record in records], final)

    def coverage(self, num_chunks: int, pid: int | None = None) -> dict[int, dict[str, int]]:
        """Per epoch of the job's :meth:`history` (``pid`` see there): chunks trained, chunks ``lost`` (never) and
        ``duplicated`` (more than once)."""
        return epoch_coverage(self.history(pid), num_chunks)

    def first_contribution_s(self, pid: int) -> float | None:
        """Seconds from starting process ``pid`` to its first committed round that trained a chunk."""
        return self.start_up(pid)["first_contribution_s"]

    def start_up(self, pid: int | None = None, name: str | None = None) -> dict[str, float | None]:
        """Seconds from starting process ``pid`` (or worker ``name``: a container's process logs the container's pid)
        to the end of its imports, of its first round end (it joined) and of its first committed round that trained
        a chunk (``None``: not yet)."""
        rows = [row for row in self.commits() if row["pid"] == pid or row["name"] == name]
        contributed = [row["since_start_s"] for row in rows if row["chunks"]]
        return {
            "imported_s": rows[0]["imported_s"] if rows else None,
            "joined_s": next((row["joined_s"] for row in rows if "joined_s" in row), None),
            "first_contribution_s": contributed[0] if contributed else None,
        }

    def results(self) -> list[dict[str, Any]]:
        return [json.loads(path.read_text()) for path in sorted(self.out.glob("worker-*.json"))]

    def errors(self) -> dict[str, str]:
        return {path.stem: path.read_text() for path in sorted(self.out.glob("error-*.txt"))}
