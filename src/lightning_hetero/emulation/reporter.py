"""The training side of the progress records: a callback that writes each rank's epoch for the host to read."""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_hetero.emulation.progress import PROGRESS_DIR_ENV, write_progress


class ProgressReporter(Callback):
    """Writes this rank's current epoch into a directory shared with the host, for epoch-scheduled emulation.

    Args:
        directory: the shared directory (mounted from the host into every worker container); defaults to the
            ``LIGHTNING_HETERO_PROGRESS_DIR`` environment variable.

    Example::

        >>> import tempfile, lightning as L
        >>> from lightning_hetero.emulation.progress import read_progress
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

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch = trainer.current_epoch
        write_progress(self.directory, trainer.global_rank, self._epoch)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # trainer.current_epoch has moved past the last epoch when training ran to max_epochs, but not after max_steps
        write_progress(self.directory, trainer.global_rank, self._epoch, done=True)
