"""Training progress shared with the host: each rank writes its epoch into a directory the host polls.

The host-side emulator (``lightning-hetero emulate`` with an epoch schedule) reads these records to know when an
epoch starts; :class:`~lightning_hetero.emulation.reporter.ProgressReporter` writes them from training. Each rank owns
one file, ``rank<N>.json``, replaced atomically so a reader never sees half a record. This module needs no Lightning,
so the host companion starts fast.

Example::

    >>> import tempfile
    >>> directory = tempfile.mkdtemp()
    >>> write_progress(directory, rank=1, epoch=3, time_s=100.0)
    >>> read_progress(directory)
    {1: RankProgress(rank=1, epoch=3, done=False, time_s=100.0)}
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

#: Where :class:`ProgressReporter` writes when no directory is given (set by ``cluster up`` and the compose files).
PROGRESS_DIR_ENV = "LIGHTNING_HETERO_PROGRESS_DIR"


@dataclass(frozen=True)
class RankProgress:
    """One rank's last record: the epoch it is in, whether training ended, and when it was written."""

    rank: int
    epoch: int
    done: bool
    time_s: float


def write_progress(
    directory: str | Path, rank: int, epoch: int, done: bool = False, time_s: float | None = None
) -> None:
    """Atomically replace ``rank<rank>.json`` in ``directory`` (created if missing)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    record = {"rank": rank, "epoch": epoch, "done": done, "time_s": time.time() if time_s is None else time_s}
    tmp = directory / f".rank{rank}.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, directory / f"rank{rank}.json")


def read_progress(directory: str | Path) -> dict[int, RankProgress]:
    """Every rank's last record in ``directory``; a missing directory reads as no records."""
    records = {}
    for path in sorted(Path(directory).glob("rank*.json")):
        data = json.loads(path.read_text())
        record = RankProgress(int(data["rank"]), int(data["epoch"]), bool(data["done"]), float(data["time_s"]))
        records[record.rank] = record
    return records
