"""Starting a study's processes side by side, each with its log, waited for together; a failed job raises with its
log's tail. Children find this package on ``PYTHONPATH`` and inherit no ``MASTER_PORT``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def free_port() -> int:
    """A TCP port free on this host now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env(source: str = "", drop: Sequence[str] = ("MASTER_PORT",), **extra: str) -> dict[str, str]:
    """This process's environment without ``drop``, with ``source`` (another checkout's ``src/``) and the repository
    root first on ``PYTHONPATH``, plus ``extra``."""
    env = {key: value for key, value in os.environ.items() if key not in drop}
    paths = [p for p in (source, str(ROOT), env.get("PYTHONPATH", "")) if p]
    return env | {"PYTHONPATH": os.pathsep.join(paths)} | extra


def scenario_command(name: str, *args: object) -> list[str]:
    """The command that runs scenario ``name`` (its worker role, given the worker's flags) in a new interpreter."""
    return [sys.executable, "-m", "benchmarks", "run", name, *map(str, args)]


def module_command(module: str, *args: object) -> list[str]:
    """The command that runs ``benchmarks.<module>`` in a new interpreter."""
    return [sys.executable, "-m", f"benchmarks.{module}", *map(str, args)]


def spawn(command: Sequence[str], log: Path, env: dict[str, str] | None = None, **popen: Any) -> subprocess.Popen:
    """Starts ``command`` in a session of its own (:func:`stop` ends it with all it started), printing into ``log``."""
    with open(log, "a") as handle:
        return subprocess.Popen(
            list(command), env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True, **popen
        )


def stop(proc: subprocess.Popen, within_s: float = 0.0) -> int | None:
    """Waits up to ``within_s`` for ``proc``, then kills its session; its exit status (``None``: it was killed)."""
    try:
        return proc.wait(timeout=max(within_s, 0.01))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


def wait_for(predicate: Callable[[], Any], timeout_s: float, poll_s: float = 0.1) -> bool:
    """Polls ``predicate`` every ``poll_s`` until it holds (``True``) or ``timeout_s`` passes (``False``)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def run_jobs(
    commands: Sequence[Sequence[str]],
    timeout_s: float = 1200,
    env: dict[str, str] | Sequence[dict[str, str]] | None = None,
    logs: Path | None = None,
    may_fail: Sequence[int] = (),
) -> list[str]:
    """Starts every command at once (``env``: one for all, or one per command), waits for all, and returns what
    each printed (kept as ``job<i>.log`` in ``logs`` if given, else in a temporary folder removed after). If a job
    not in ``may_fail`` (indices) fails, or the jobs run past ``timeout_s``, every job is ended with all it started,
    and ``RuntimeError`` names the command and its log's tail."""
    if logs is None:
        with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
            return run_jobs(commands, timeout_s, env, Path(tmp), may_fail)
    folder = logs
    folder.mkdir(parents=True, exist_ok=True)
    envs = [child_env()] * len(commands) if env is None else [env] * len(commands) if isinstance(env, dict) else env
    logs_of = [folder / f"job{i}.log" for i in range(len(commands))]
    started = [(spawn(c, log, e, cwd=ROOT), log) for c, log, e in zip(commands, logs_of, envs, strict=True)]
    deadline, failed = time.monotonic() + timeout_s, None
    try:
        while failed is None and any(proc.poll() is None for proc, _ in started):
            bad = [i for i, (proc, _) in enumerate(started) if proc.poll() not in (None, 0) and i not in may_fail]
            if bad:
                failed = (bad[0], f"exit {started[bad[0]][0].returncode}")
            elif time.monotonic() > deadline:
                failed = (0, f"ran past {timeout_s:g} s")
            time.sleep(0.1)
    finally:  # also when this process is stopped: no rank is left waiting in a collective
        for proc, _ in started:
            stop(proc)
    if failed is None:
        bad = [i for i, (proc, _) in enumerate(started) if proc.returncode != 0 and i not in may_fail]
        failed = (bad[0], f"exit {started[bad[0]][0].returncode}") if bad else None
    if failed is not None:
        proc, log = started[failed[0]]
        raise RuntimeError(f"job failed ({failed[1]}): {' '.join(map(str, proc.args))}\n{log.read_text()[-3000:]}")
    return [log.read_text() for _, log in started]


def run_job(command: Sequence[str], timeout_s: float = 1200, env: dict[str, str] | None = None) -> str:
    """One job, as :func:`run_jobs`."""
    return run_jobs([command], timeout_s, env)[0]


def run_json(
    command: Callable[[Path], Sequence[str]], timeout_s: float = 1200, env: dict[str, str] | None = None
) -> Any:
    """Runs the job ``command(out)`` (as :func:`run_job`), which writes JSON to ``out`` (a file in a temporary
    folder), and returns what it wrote."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        out = Path(tmp) / "result.json"
        run_job(command(out), timeout_s, env)
        return json.loads(out.read_text())


def run_ranks(
    command: Sequence[str],
    world_size: int,
    timeout_s: float = 1200,
    rank_env: dict[int, dict[str, str]] | None = None,
    may_fail: Sequence[int] = (),
) -> list[str]:
    """``command`` as every rank of a ``world_size``-node job on this host (one process a rank: ``MASTER_ADDR``,
    a free ``MASTER_PORT``, ``NODE_RANK``, ``WORLD_SIZE``; ``rank_env`` adds to a rank's), as :func:`run_jobs`."""
    port = str(free_port())
    envs = [
        child_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK=str(rank), LOCAL_RANK="0")
        | {"WORLD_SIZE": str(world_size), "PYTHONUNBUFFERED": "1"}
        | (rank_env or {}).get(rank, {})
        for rank in range(world_size)
    ]
    return run_jobs([command] * world_size, timeout_s, envs, may_fail=may_fail)
