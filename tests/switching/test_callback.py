"""The callback in one process, driving a stand-in strategy that records its mode switches."""

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import SingleDeviceStrategy

from lightning_hetero.measurement import ComputeTimer
from lightning_hetero.switching import GreedyPolicy, PhaseHyperparams, StragglerDetector
from lightning_hetero.switching.callback import SyncSwitchCallback
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule


class ModeSwitchingStrategy(SingleDeviceStrategy):
    """A single-process strategy with the mode interface of AsyncPSStrategy."""

    def __init__(self, mode="bsp"):
        super().__init__(device=torch.device("cpu"))
        self.mode = mode
        self.set_mode_calls = []
        self.last_switch_s = None

    def set_mode(self, mode):
        self.set_mode_calls.append(mode)
        self.mode = mode
        self.last_switch_s = 0.001


class FakeClock:
    """A clock that only moves when a test model says so, making compute windows deterministic."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class RecordingModel(MLPClassifier):
    """Records the strategy's mode and the learning rate at every step. With a ``clock``, each step's compute
    takes 1 ms per sample, ``slowdown`` times longer in ``slow_epochs``."""

    def __init__(self, clock=None, slow_epochs=(), slowdown=1.0, **kwargs):
        super().__init__(**kwargs)
        self.clock = clock
        self.slow_epochs = set(slow_epochs)
        self.slowdown = slowdown
        self.modes = {}
        self.lrs = {}

    def training_step(self, batch, batch_idx):
        epoch = self.current_epoch
        self.modes[epoch] = self.trainer.strategy.mode
        self.lrs.setdefault(epoch, self.trainer.optimizers[0].param_groups[0]["lr"])
        if self.clock is not None:
            self.clock.now += 0.001 * len(batch[0]) * (self.slowdown if epoch in self.slow_epochs else 1.0)
        return super().training_step(batch, batch_idx)


def make_trainer(callback, max_epochs, strategy=None, **kwargs):
    defaults = {"logger": False, "enable_checkpointing": False}
    defaults.update(kwargs)
    return L.Trainer(
        accelerator="cpu",
        strategy=strategy if strategy is not None else ModeSwitchingStrategy(),
        max_epochs=max_epochs,
        callbacks=[callback, *defaults.pop("callbacks", [])],
        enable_progress_bar=False,
        enable_model_summary=False,
        **defaults,
    )


def datamodule(num_samples=128):
    return SyntheticClassificationDataModule(num_samples=num_samples, batch_size=16)


def test_setup_rejects_a_strategy_without_set_mode():
    trainer = make_trainer(SyncSwitchCallback("bsp:0-"), 1, strategy=SingleDeviceStrategy(torch.device("cpu")))
    with pytest.raises(TypeError, match="needs a strategy with `mode` and `set_mode"):
        trainer.fit(MLPClassifier(), datamodule=datamodule())


def test_setup_rejects_a_schedule_shorter_than_the_run():
    trainer = make_trainer(SyncSwitchCallback("bsp:0-1,asp:2"), 4)
    with pytest.raises(ValueError, match="covers epochs 0-2 only"):
        trainer.fit(MLPClassifier(), datamodule=datamodule())


def test_policy_type_is_checked():
    with pytest.raises(TypeError, match="SwitchPolicy"):
        SyncSwitchCallback(policy=0.05)


def test_fixed_schedule_yields_the_planned_modes_and_logs_them(tmp_path):
    callback = SyncSwitchCallback("asp:0,bsp:1-2,asp:3-", hyperparams={"asp": PhaseHyperparams(lr_scale=0.5)})
    model = RecordingModel(lr=0.1)
    trainer = make_trainer(callback, 5, logger=CSVLogger(tmp_path), log_every_n_steps=1)
    trainer.fit(model, datamodule=datamodule())
    planned = ["asp", "bsp", "bsp", "asp", "asp"]
    assert [model.modes[e] for e in range(5)] == planned
    assert callback.history == planned
    # One switch before training (the strategy starts in BSP), then one at each phase boundary.
    assert trainer.strategy.set_mode_calls == ["asp", "bsp", "asp"]
    assert [(s["epoch"], s["to"], s["cost_s"]) for s in callback.switches] == [
        (0, "asp", 0.001),
        (1, "bsp", 0.001),
        (3, "asp", 0.001),
    ]
    assert [model.lrs[e] for e in range(5)] == pytest.approx([0.05, 0.1, 0.1, 0.05, 0.05])
    metrics = (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_text().splitlines()
    header = metrics[0].split(",")
    logged = {}
    for name in ("bsp", "asp", "local"):
        column = header.index(f"sync_switch/{name}")
        logged[name] = [float(row.split(",")[column]) for row in metrics[1:] if row.split(",")[column]]
    assert logged == {"bsp": [0, 1, 1, 0, 0], "asp": [1, 0, 0, 1, 1], "local": [0] * 5}  # one-hot per epoch


def test_summary_lists_phases_and_switch_costs(caplog):
    callback = SyncSwitchCallback("bsp:0-1,asp:2-")
    make_trainer(callback, 3).fit(MLPClassifier(), datamodule=datamodule())
    summary = callback.summary()
    lines = summary.splitlines()
    assert lines[2].split()[:2] == ["bsp", "0-1"]
    assert lines[3].split()[:2] == ["asp", "2"]
    assert "switch bsp -> asp before epoch 2: 0.001 s" in summary
    phases_samples = sum(record["samples"] for record in callback.epochs)
    assert phases_samples == 3 * 128


def test_resume_from_a_checkpoint_continues_the_schedule(tmp_path):
    schedule = "bsp:0-1,asp:2-3,bsp:4-"
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, every_n_epochs=1, filename="{epoch}")
    first = SyncSwitchCallback(schedule, hyperparams={"asp": PhaseHyperparams(lr_scale=0.5)})
    trainer = make_trainer(first, 3, callbacks=[checkpoint], enable_checkpointing=True)
    trainer.fit(RecordingModel(lr=0.1), datamodule=datamodule())
    assert first.history == ["bsp", "bsp", "asp"]

    # Resume after epoch 2 (ASP) with a fresh strategy that starts in BSP, as a restarted job would.
    resumed = SyncSwitchCallback(schedule, hyperparams={"asp": PhaseHyperparams(lr_scale=0.5)})
    model = RecordingModel(lr=0.1)
    trainer = make_trainer(resumed, 6)
    trainer.fit(model, datamodule=datamodule(), ckpt_path=tmp_path / "epoch=2.ckpt")
    assert {e: model.modes[e] for e in range(3, 6)} == {3: "asp", 4: "bsp", 5: "bsp"}
    assert resumed.history == ["bsp", "bsp", "asp", "asp", "bsp", "bsp"]
    # The checkpointed optimizer already carries the ASP scale; it is not applied twice, and undone at the switch.
    assert model.lrs[3] == pytest.approx(0.05)
    assert model.lrs[4] == pytest.approx(0.1)
    assert trainer.strategy.set_mode_calls == ["asp", "bsp"]


def test_resume_from_a_checkpoint_taken_at_validation_end(tmp_path):
    # With validation, ModelCheckpoint saves before this callback's epoch end: the checkpoint lacks the last epoch.
    schedule = "bsp:0,asp:1,bsp:2-"
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, every_n_epochs=1, filename="{epoch}")
    trainer = make_trainer(SyncSwitchCallback(schedule), 2, callbacks=[checkpoint], enable_checkpointing=True)
    trainer.fit(RecordingModel(), datamodule=datamodule())
    resumed = SyncSwitchCallback(schedule)
    model = RecordingModel()
    make_trainer(resumed, 4).fit(model, datamodule=datamodule(), ckpt_path=tmp_path / "epoch=0.ckpt")
    assert {e: model.modes[e] for e in range(1, 4)} == {1: "asp", 2: "bsp", 3: "bsp"}
    assert resumed.history == ["bsp", "asp", "bsp", "bsp"]


def test_greedy_switches_to_asp_on_an_injected_straggler_and_back():
    detector = StragglerDetector(threshold=0.5, k=3, baseline_measurements=4)
    callback = SyncSwitchCallback(GreedyPolicy(), detector=detector, smoothing=1.0, warmup_steps=1)
    clock = FakeClock()
    callback.timer = ComputeTimer(clock=clock)
    # 16 steps per epoch; in epochs 2 and 3 this rank computes 4x slower.
    model = RecordingModel(clock=clock, slow_epochs=(2, 3), slowdown=4.0)
    make_trainer(callback, 6, limit_val_batches=0).fit(model, datamodule=datamodule(256))
    assert [model.modes[e] for e in range(6)] == ["bsp", "bsp", "bsp", "asp", "asp", "bsp"]
    assert detector.baseline == pytest.approx(16 / 0.016)
    assert [record["epoch"] for record in callback.epochs] == list(range(6))


@pytest.mark.parametrize("wired", [False, True], ids=["found", "given"])
def test_greedy_reuses_hetero_batch_measurements(wired):
    from lightning_hetero.hetero_batch import HeteroBatchCallback

    hetero = HeteroBatchCallback(verbose=False, smoothing=1.0, warmup_steps=1)
    clock = FakeClock()
    hetero.timer = ComputeTimer(clock=clock)
    detector = StragglerDetector(threshold=0.5, k=3, baseline_measurements=4)
    # without throughput_meter the callback finds the HeteroBatchCallback's meter by itself
    meter = {"throughput_meter": hetero.meter} if wired else {}
    callback = SyncSwitchCallback(GreedyPolicy(), detector=detector, **meter)
    model = RecordingModel(clock=clock, slow_epochs=(1,), slowdown=4.0)
    make_trainer(callback, 3, limit_val_batches=0, callbacks=[hetero]).fit(model, datamodule=datamodule(256))
    assert [model.modes[e] for e in range(3)] == ["bsp", "bsp", "asp"]
    assert callback.meter.count == 0


class ScheduledModel(RecordingModel):
    """SGD with a step-interval LambdaLR halving the learning rate every 8 steps."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 ** (step // 8))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class ModeDependentData(SyntheticClassificationDataModule):
    """Like an ASP worker that is faster than average: in ASP epochs this rank makes twice as many steps."""

    def train_dataloader(self):
        loader = super().train_dataloader()
        if self.trainer.strategy.mode == "asp":
            return torch.utils.data.DataLoader(self.train_set, batch_size=self.batch_size // 2, shuffle=True)
        return loader


class SchedulePositions(L.Callback):
    def __init__(self):
        self.positions = []

    def on_train_epoch_end(self, trainer, pl_module):
        self.positions.append(trainer.lr_scheduler_configs[0].scheduler.last_epoch)


def test_step_schedules_advance_by_epoch_whatever_the_steps_per_epoch():
    callback = SyncSwitchCallback("bsp:0,asp:1-2,bsp:3-")
    positions = SchedulePositions()
    model = ScheduledModel()
    trainer = make_trainer(callback, 5, callbacks=[positions], reload_dataloaders_every_n_epochs=1)
    trainer.fit(model, datamodule=ModeDependentData(num_samples=128, batch_size=16))
    # 8 BSP steps per epoch and 16 in ASP, but the schedule moves 8 steps per epoch throughout.
    assert callback._local_steps == {"bsp": 8, "asp": 16}
    assert positions.positions == [8, 16, 24, 32, 40]
    assert model.lrs == {0: 1.0, 1: 0.5, 2: 0.25, 3: 0.125, 4: 0.0625}
    # Lightning steps the scheduler itself again after fit.
    assert trainer.lr_scheduler_configs[0].frequency == 1


class CompensatingStrategy(ModeSwitchingStrategy):
    """The stand-in strategy with AsyncPSStrategy's compensation setting."""

    def __init__(self, mode="bsp"):
        super().__init__(mode)
        self.asynchrony_compensation = "auto"


@pytest.mark.parametrize(("hyperparams", "expected"), [(None, "auto"), ({"bsp": {}}, "auto"), ({"asp": {}}, None)])
def test_asp_phase_hyperparams_turn_the_strategys_compensation_off(hyperparams, expected):
    strategy = CompensatingStrategy()
    trainer = make_trainer(SyncSwitchCallback("bsp:0,asp:1", hyperparams=hyperparams), 2, strategy=strategy)
    trainer.fit(MLPClassifier(), datamodule=datamodule())
    assert strategy.set_mode_calls == ["asp"]
    assert strategy.asynchrony_compensation == expected


def test_the_old_schedule_steps_per_epoch_argument_still_works_with_a_deprecation_warning():
    with pytest.deprecated_call(match=r"SyncSwitchCallback\(schedule_steps_per_epoch=...\) is deprecated"):
        callback = SyncSwitchCallback(schedule_steps_per_epoch=12, verbose=False)
    assert callback.lr_schedule_clock.steps_per_epoch == 12
    assert SyncSwitchCallback(lr_schedule_steps_per_epoch=7).lr_schedule_clock.steps_per_epoch == 7
    with pytest.raises(TypeError, match="give lr_schedule_steps_per_epoch only"):
        SyncSwitchCallback(lr_schedule_steps_per_epoch=7, schedule_steps_per_epoch=7)
