"""Shared test fixtures. Multi-process Lightning runs are launched as separate processes (see ``run_script``)."""

from __future__ import annotations

import json
import os
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
    """Run ``tests/scripts/<name>`` in a fresh interpreter; Lightning's launcher starts the other ranks from it."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.pop("MASTER_PORT", None)
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        cwd=str(SCRIPTS),
    )
    if expect_ok and proc.returncode != 0:
        raise AssertionError(
            f"{name} exited with {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n"
            f"--- stderr ---\n{proc.stderr[-6000:]}"
        )
    return proc


@pytest.fixture
def run_script() -> Callable[..., subprocess.CompletedProcess]:
    return _run_script


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())
