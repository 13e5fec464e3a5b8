"""SlowdownEmulator stretching device time: a fake device whose host calls return at once."""

import itertools

import lightning as L
import pytest

from lightning_hetero import HeteroBatchCallback, SlowdownEmulator
from lightning_hetero.hetero_batch import HeteroBatchAdvanced
from lightning_hetero.measurement import BusyTimer
from lightning_hetero.step_clock import FakeDevice
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule


class Host:
    """A host clock that advances a microsecond per read, and jumps when the host waits for the device."""

    def __init__(self) -> None:
        self.ticks, self.waited = itertools.count(), 0.0

    def __call__(self) -> float:
        return self.waited + next(self.ticks) * 1e-6


def _fit(factor):
    host = Host()
    device = FakeDevice(host)

    class Queued(MLPClassifier):
        def training_step(self, batch, batch_idx):
            host.waited = max(host.waited, device.free_at)  # the host waits for the last step (a `.item()`)
            device.launch(0.001 * len(batch[0]))
            return super().training_step(batch, batch_idx)

    emulator = SlowdownEmulator({0: factor})
    emulator.device_clock = device
    hetero = HeteroBatchCallback(verbose=False, advanced=HeteroBatchAdvanced(warmup_steps=2))
    hetero.busy = BusyTimer(clock=device, cpu_clock=None)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        callbacks=[emulator, hetero],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Queued(), datamodule=SyntheticClassificationDataModule(num_samples=320, batch_size=32))
    return emulator, hetero


def test_a_rank_slowed_three_times_takes_three_times_the_device_time():
    slowed, hetero = _fit(3.0)
    assert slowed.total_stretch_s == 0.0  # nothing slept on the host
    assert hetero.tuner.busy_s[0] == pytest.approx(3 * 0.032, rel=1e-2)
    _, plain = _fit(1.0)
    assert plain.tuner.busy_s[0] == pytest.approx(0.032, rel=1e-2)
