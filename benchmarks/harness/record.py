"""Results with their conditions: every JSON a study writes carries the commit, the load average, the versions and
the host's cores it was measured with."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.launch import ROOT


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def conditions() -> dict[str, Any]:
    """Where and on what a figure was measured, now."""
    versions = {"python": platform.python_version()}
    for name in ("torch", "lightning", "lightning_hetero"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = None
    commit = _git("rev-parse", "--short", "HEAD")
    return {
        "commit": commit + ("+dirty" if commit and _git("status", "--porcelain", "--untracked-files=no") else ""),
        "load_average": list(os.getloadavg()),
        "versions": versions,
        "host_cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "machine": platform.platform(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_json(path: Path | str, payload: dict[str, Any], indent: int | None = 1) -> Path:
    """Writes ``payload`` with ``harness_conditions`` (:func:`conditions`) added; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload | {"harness_conditions": conditions()}, indent=indent, default=str))
    return path
