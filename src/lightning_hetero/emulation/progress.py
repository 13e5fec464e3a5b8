"""Training progress shared with the host: each rank writes its epoch into a directory the host polls.

The host-side emulator (``lightning-hetero emulate`` with an epoch schedule) reads these records to know when an
epoch starts. Each rank owns one file, ``rank<N>.json``, replaced atomically so a reader never sees half a record.

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

import lightning as L
from lightning.pytorch.callbacks import Callback

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


class ProgressReporter(Callback):
    """Writes this rank's current epoch into a directory shared with the host, for epoch-scheduled emulation.

    Args:
        directory: the shared directory (mounted from the host into every worker container); defaults to the
            ``LIGHTNING_HETERO_PROGRESS_DIR`` environment variable.

    Example::

        >>> import tempfile, lightning as L
        >>> from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule
        >>> directory = tempfile.mkdtemp()
        >>> trainer = L.Trainer(max_epochs=2, callbacks=[ProgressReporter(directory)], logger=False,
        ...                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        >>> trainer.fit(MLPClassifier(), datamodule=SyntheticClassificationDataModule(num_samples=64))
        >>> record = read_progress(directory)[0]
        >>> record.epoch, record.done
        (1, True)

    Notes:
        Every rank writes its own file, so the directory must be shared by all ranks on a host (or mounted from one
        host into every container). The host acts on the most advanced rank's epoch.
    """

    def __init__(self, directory: str | Path | None = None) -> None:
        directory = directory if directory is not None else os.environ.get(PROGRESS_DIR_ENV)
        if not directory:
            raise ValueError(f"ProgressReporter needs a directory, or the {PROGRESS_DIR_ENV} environment variable")
        self.directory = Path(directory)
        self._epoch = 0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch = trainer.current_epoch
        write_progress(self.directory, trainer.global_rank, self._epoch)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # trainer.current_epoch has moved past the last epoch when training ran to max_epochs, but not after max_steps
        write_progress(self.directory, trainer.global_rank, self._epoch, done=True)
