"""Results with their conditions (every JSON a study writes carries the commit, the load average, the versions, the
host's cores, the study's flags and wall time), and the tables the studies print."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness.launch import ROOT

_STUDY: dict[str, Any] = {}


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def begin(flags: Any) -> None:
    """Marks a study's start: :func:`conditions` then adds its flags (``vars(flags)``), the load average at its start
    and its wall time so far."""
    _STUDY.update(flags=dict(vars(flags)), load_average_at_start=list(os.getloadavg()), started=time.time())


def conditions() -> dict[str, Any]:
    """Where and on what a figure was measured, now (and the study's flags, if :func:`begin` marked its start)."""
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
    } | (
        {k: v for k, v in _STUDY.items() if k != "started"} | {"wall_s": time.time() - _STUDY["started"]}
        if _STUDY
        else {}
    )


def write_json(path: Path | str, payload: dict[str, Any], indent: int | None = 1, quiet: bool = False) -> Path:
    """Writes ``payload`` with ``harness_conditions`` (:func:`conditions`) added and says so (``quiet``: a study's
    results so far, written again later); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload | {"harness_conditions": conditions()}, indent=indent, default=str))
    if not quiet:
        print(f"wrote {path}")
    return path


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], formats: Sequence[str] = ()) -> str:
    """``rows`` under ``header``, each column right-aligned to its widest cell; a cell is formatted with its column's
    entry of ``formats`` (missing or ``""``: as it prints), and ``None`` prints as ``-``.

    Example::

        >>> print(table(["config", "ratio"], [["asp", 0.912], ["local", None]], ["", ".2f"]))
        config  ratio
           asp   0.91
         local      -
    """
    specs = [*formats, *[""] * (len(header) - len(formats))]
    cells = [list(header)] + [
        ["-" if v is None else format(v, f) for v, f in zip(row, specs, strict=True)] for row in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in cells)
