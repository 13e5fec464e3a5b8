"""One test per function in ``lightning_hetero._lightning_internals``: each fails loudly if Lightning changes the
private name or attribute the function relies on."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from lightning_hetero._lightning_internals import (
    NEVER_STEPPED,
    lr_scheduler_paused,
    pause_lr_scheduler,
    rebuild_train_dataloader,
    resume_lr_scheduler,
)
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule

# --- trainer, loops and data ---


def _trainer(*callbacks: Callback, max_epochs: int = 1) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=max_epochs,
        callbacks=list(callbacks),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


class _StepLRClassifier(MLPClassifier):
    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 2}}


class _PauseSchedulers(Callback):
    def __init__(self, pause: bool) -> None:
        self.pause = pause
        self.frequencies: list[int] = []

    def on_train_start(self, trainer, pl_module):
        if self.pause:
            self.frequencies = [pause_lr_scheduler(config) for config in trainer.lr_scheduler_configs]

    def on_train_end(self, trainer, pl_module):
        self.paused_at_end = [lr_scheduler_paused(config) for config in trainer.lr_scheduler_configs]
        for config, frequency in zip(trainer.lr_scheduler_configs, self.frequencies, strict=False):
            resume_lr_scheduler(config, frequency)


@pytest.mark.parametrize("pause", [False, True])
def test_a_paused_step_scheduler_is_never_stepped_by_lightnings_loop(pause):
    """Relies on ``TrainingEpochLoop._update_learning_rates`` stepping a config when ``(batch_idx + 1) % frequency
    == 0``: unpaused, the scheduler steps every second batch; paused, never."""
    model, callback = _StepLRClassifier(), _PauseSchedulers(pause)
    trainer = _trainer(callback)
    trainer.fit(model, datamodule=SyntheticClassificationDataModule(num_samples=256, batch_size=32))
    (config,) = trainer.lr_scheduler_configs
    assert config.scheduler.last_epoch == (0 if pause else 4), "8 batches at frequency 2: 4 steps unless paused"
    assert callback.paused_at_end == [pause]
    assert config.frequency == 2, "resume_lr_scheduler gives the config its own frequency back"
    assert NEVER_STEPPED > 10**12


class _Rebuild(Callback):
    def __init__(self) -> None:
        self.seen: list[int] = []

    def setup(self, trainer, pl_module, stage):
        rebuild_train_dataloader(trainer, self.rebuild)
        rebuild_train_dataloader(trainer, self.rebuild)  # idempotent: the loader is rebuilt once, not twice

    def rebuild(self, loader):
        self.seen.append(loader.batch_size)
        return torch.utils.data.DataLoader(loader.dataset, batch_size=64)


def test_rebuild_train_dataloader_sees_the_users_loader_and_lightning_trains_on_the_rebuilt_one():
    """Relies on ``_FitLoop.setup_data`` requesting the train loader from ``fit_loop._data_source.dataloader()``."""
    callback = _Rebuild()
    trainer = _trainer(callback, max_epochs=2)
    trainer.fit(MLPClassifier(), datamodule=SyntheticClassificationDataModule(num_samples=256, batch_size=32))
    assert callback.seen == [32], "the user's loader (batch 32) went through rebuild once"
    assert trainer.num_training_batches == 4, "256 samples in batches of 64: Lightning trained on the rebuilt loader"
    assert trainer.train_dataloader.batch_size == 64


# --- strategies, launchers and module state ---
