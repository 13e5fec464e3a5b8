"""Helpers the tests import: running the training scripts of ``tests/scripts`` as processes, and reading their
JSON reports. ``conftest.py`` wraps the runners in fixtures (``run_script``, ``run_ranks``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).parent / "scripts"


def run_script(name: str, *args: str, timeout_s: float = 120, expect_ok: bool = True) -> subprocess.CompletedProcess:
    """Run ``tests/scripts/<name>`` in a fresh interpreter; Lightning's launcher starts the other ranks from it.

    As :func:`run_command`, in ``tests/scripts`` and without the caller's ``MASTER_PORT``.
    """
    env = dict(os.environ)
    env.pop("MASTER_PORT", None)
    command = [sys.executable, str(SCRIPTS / name), *args]
    return run_command(command, timeout_s=timeout_s, expect_ok=expect_ok, cwd=SCRIPTS, env=env)


def run_command(
    command: list[str],
    timeout_s: float = 120,
    expect_ok: bool = True,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run ``command`` (unbuffered Python output) in its own session, so a run past ``timeout_s`` is killed with
    every process it started; a failure (or, with ``expect_ok``, a non-zero exit) shows the tails of what it printed.
    """
    env = dict(os.environ if env is None else env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    name = Path(command[1]).name if len(command) > 1 else command[0]
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=None if cwd is None else str(cwd),
        start_new_session=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            raise AssertionError(f"{name} ran past {timeout_s} s and was killed\n{_tails(stdout, stderr)}") from None
    if expect_ok and proc.returncode != 0:
        raise AssertionError(f"{name} exited with {proc.returncode}\n{_tails(stdout, stderr)}")
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def run_ranks(
    name: str, world_size: int, *args: str, timeout_s: float = 180, start: int | None = None
) -> list[subprocess.CompletedProcess]:
    """Start ``world_size`` processes of ``tests/scripts/<name>`` the way a multi-node job does (one process per
    node: ``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK``, ``WORLD_SIZE``; pass ``--num-nodes``), each in its own
    session (only the first ``start`` ranks when given); wait for all. Each result carries ``elapsed_s`` (seconds
    from the start until that process exited) and ``ended_at`` (its ``time.time()`` then). Processes still running
    after ``timeout_s`` are killed and reported with returncode ``None``."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    started = time.monotonic()
    for rank in range(world_size if start is None else start):
        env = dict(os.environ, PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.update(NODE_RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(world_size))
        command = [sys.executable, str(SCRIPTS / name), *args]
        procs.append(
            subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=str(SCRIPTS),
                start_new_session=True,
            )
        )
    ended: dict[int, float] = {}
    ended_at: dict[int, float] = {}
    while len(ended) < len(procs) and time.monotonic() - started < timeout_s:
        for rank, proc in enumerate(procs):
            if rank not in ended and proc.poll() is not None:
                ended[rank] = time.monotonic() - started
                ended_at[rank] = time.time()
        time.sleep(0.1)
    results = []
    for rank, proc in enumerate(procs):
        if rank not in ended:
            os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        result = subprocess.CompletedProcess(proc.args, proc.returncode if rank in ended else None, stdout, stderr)
        result.elapsed_s = ended.get(rank)
        result.ended_at = ended_at.get(rank)
        results.append(result)
    return results


def _tails(stdout: str, stderr: str) -> str:
    return f"--- stdout ---\n{stdout[-4000:]}\n--- stderr ---\n{stderr[-6000:]}"


def read_json(path: Path) -> Any:
    """A JSON report written by a training script."""
    return json.loads(Path(path).read_text())


def single_device_trainer(callback: Any, **overrides: Any) -> Any:
    """A one-process CPU Trainer for one epoch with nothing but ``callback`` (no logger, checkpoints or bars)."""
    import lightning as L

    kwargs = dict(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    return L.Trainer(**{**kwargs, **overrides})
