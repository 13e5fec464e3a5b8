"""Shared test fixtures. Multi-process Lightning runs are launched as separate processes (see ``run_script``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).parent / "scripts"

# The scripts are launched as processes, never imported by pytest (not even for --doctest-modules).
collect_ignore_glob = ["scripts/*"]


def _run_script(name: str, *args: str, timeout_s: float = 120, expect_ok: bool = True) -> subprocess.CompletedProcess:
    """Run ``tests/scripts/<name>`` in a fresh interpreter; Lightning's launcher starts the other ranks from it.

    The script runs in its own session, so a run past ``timeout_s`` is killed with every rank it started, and the
    failure shows what the ranks printed until then.
    """
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.pop("MASTER_PORT", None)
    command = [sys.executable, str(SCRIPTS / name), *args]
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(SCRIPTS),
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


def _tails(stdout: str, stderr: str) -> str:
    return f"--- stdout ---\n{stdout[-4000:]}\n--- stderr ---\n{stderr[-6000:]}"


@pytest.fixture
def run_script() -> Callable[..., subprocess.CompletedProcess]:
    return _run_script


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())
