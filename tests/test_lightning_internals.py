"""One test per function in ``lightning_hetero._lightning_internals``: each fails loudly if Lightning changes the
private name or attribute the function relies on."""

from __future__ import annotations

import inspect
import signal
import subprocess
import sys
from datetime import timedelta

import lightning as L
import pytest
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.callbacks import Callback
from packaging.version import Version
from torch.utils.data import DataLoader, SequentialSampler

from lightning_hetero._lightning_internals import (
    NEVER_STEPPED,
    advance_current_epoch,
    forget_train_dataloader,
    inside_training_batch,
    is_last_batch,
    kill_launched_processes,
    launched_processes,
    layer_sync_requested,
    load_strategy_checkpoint,
    lr_scheduler_paused,
    optimizers_to_device,
    pause_lr_scheduler,
    rebuild_train_dataloader,
    rebuild_validation_loaders,
    replace_sigterm_broadcast,
    resume_lr_scheduler,
    set_current_epoch,
    set_default_group_timeout,
    set_global_step,
    set_max_steps,
    set_val_check_batch,
    sync_module_states,
    uses_distributed_sampler,
    validates_on_time_interval,
    with_sampler,
)
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule

#: Lightning 2.6 added time-based ``val_check_interval`` and the epoch loop's SIGTERM broadcast; before it, the
#: functions that rely on them have nothing to read or replace (the version matrix runs the oldest declared Lightning).
LIGHTNING_2_6 = Version(L.__version__).release >= (2, 6)

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
# Each test names the private thing its function relies on; they run on the installed Lightning (2.6.6 when written).


@pytest.fixture
def single_rank_group(tmp_path):
    """A default process group of one gloo rank (what the ps/ functions run under)."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class _Recorder(L.Callback):
    """Calls ``probe(trainer)`` inside every training step and keeps what it returns."""

    def __init__(self, probe):
        self.probe, self.seen = probe, []

    def on_before_backward(self, trainer, pl_module, loss):
        self.seen.append(self.probe(trainer))


def _fit(*callbacks, batches=3, epochs=1, **kwargs):
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=epochs, limit_train_batches=batches, limit_val_batches=1,
        callbacks=list(callbacks), logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, **kwargs,
    )  # fmt: skip
    trainer.fit(MLPClassifier(), datamodule=SyntheticClassificationDataModule(num_samples=64, batch_size=8))
    return trainer


def test_strategy_registry_type_is_lightnings_registry():
    from lightning.fabric.strategies import _StrategyRegistry
    from lightning.pytorch.strategies import StrategyRegistry

    assert isinstance(StrategyRegistry, _StrategyRegistry) and callable(StrategyRegistry.register)
    # the package registers a factory until the strategy's class is imported: the registry calls what it holds
    registry = _StrategyRegistry()
    registry.register("made", lambda **kwargs: ("made", kwargs), description="", answer=42)
    assert registry.get("made") == ("made", {"answer": 42})


def test_optimizers_to_device_moves_the_optimizer_state():
    param = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([param], lr=0.1, momentum=0.9)
    param.grad = torch.ones(2)
    optimizer.step()
    optimizer.state[param]["momentum_buffer"] = optimizer.state[param]["momentum_buffer"].to(torch.float64)
    optimizers_to_device([optimizer], torch.device("meta"))
    assert optimizer.state[param]["momentum_buffer"].device.type == "meta"


def test_sync_module_states_broadcasts_over_the_default_group(single_rank_group):
    module = torch.nn.BatchNorm1d(3)
    before = {name: value.clone() for name, value in module.state_dict().items()}
    sync_module_states(module)  # one rank: the broadcast leaves everything as it is, but must run
    assert all(torch.equal(before[name], value) for name, value in module.state_dict().items())


def test_launched_processes_is_the_subprocess_launchers_own_list():
    from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher

    launcher = _SubprocessScriptLauncher(LightningEnvironment(), num_processes=2, num_nodes=1)
    assert launched_processes(launcher) is launcher.procs
    assert isinstance(launcher.procs, list)
    assert launched_processes(object()) is None


def test_kill_launched_processes_kills_the_launchers_children():
    from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher

    launcher = _SubprocessScriptLauncher(LightningEnvironment(), num_processes=2, num_nodes=1)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    launcher.procs.append(child)
    kill_launched_processes(launcher)
    assert child.wait(timeout=30) == -signal.SIGKILL
    kill_launched_processes(object())  # other launchers: nothing to do


def test_with_sampler_rebuilds_the_loader_around_the_sampler():
    loader = DataLoader(list(range(10)), batch_size=4, shuffle=True, drop_last=True)
    sampler = SequentialSampler(range(10))
    rebuilt = with_sampler(loader, sampler)
    assert rebuilt.sampler is sampler and (rebuilt.batch_size, rebuilt.drop_last) == (4, True)
    assert [batch.tolist() for batch in rebuilt] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_uses_distributed_sampler_reads_the_trainer_argument():
    assert uses_distributed_sampler(L.Trainer(accelerator="cpu", logger=False)) is True
    assert uses_distributed_sampler(L.Trainer(accelerator="cpu", logger=False, use_distributed_sampler=False)) is False


def test_validates_on_time_interval_sees_a_duration_and_fails_loudly_without_the_attribute():
    assert validates_on_time_interval(L.Trainer(accelerator="cpu", logger=False)) is False
    if not LIGHTNING_2_6:
        pytest.skip(f"Lightning {L.__version__} has no time-based val_check_interval (False above is the answer)")
    timed = L.Trainer(accelerator="cpu", logger=False, val_check_interval=timedelta(seconds=5))
    assert validates_on_time_interval(timed) is True
    del timed._val_check_time_interval
    with pytest.raises(RuntimeError, match="_val_check_time_interval"):
        validates_on_time_interval(timed)


def test_replace_sigterm_broadcast_hands_lightnings_own_broadcast_to_the_check():
    trainer = L.Trainer(accelerator="cpu", logger=False)
    if not LIGHTNING_2_6:
        replace_sigterm_broadcast(trainer, pytest.fail)  # nothing to replace: each rank checks its own flag
        assert not hasattr(trainer.fit_loop.epoch_loop, "_broadcast_sigterm_tensor")
        return
    original = trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor
    received = []
    replace_sigterm_broadcast(trainer, received.append)
    trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor()
    assert received == [original]


def test_batch_progress_functions_follow_a_real_epoch():
    recorder = _Recorder(lambda t: (is_last_batch(t), inside_training_batch(t)))
    trainer = _fit(recorder, batches=3)
    assert recorder.seen == [(False, True), (False, True), (True, True)]
    assert not inside_training_batch(trainer)


def test_set_global_step_is_what_trainer_global_step_reads():
    trainer = _fit(batches=2)
    assert trainer.global_step == 2
    set_global_step(trainer, 7, in_step=False)
    assert trainer.global_step == 7
    set_global_step(trainer, 7, in_step=True)  # the loop adds the step in progress once it completes
    assert trainer.global_step == 6


def test_set_current_epoch_before_the_fit_loop_starts_an_epoch_runs_from_it():
    epochs = []

    class Join(L.Callback):
        def on_train_start(self, trainer, pl_module):
            set_current_epoch(trainer, 3)  # a worker joining a running job at its epoch 3

        def on_train_epoch_start(self, trainer, pl_module):
            epochs.append(trainer.current_epoch)

    trainer = _fit(Join(), epochs=5)
    assert epochs == [3, 4] and trainer.current_epoch == 5


def test_advance_current_epoch_in_an_epoch_moves_the_fit_loop_on():
    epochs = []

    class CatchUp(L.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == 1:
                advance_current_epoch(trainer, 2)  # a worker that fetched the job's state two epochs on
            epochs.append(trainer.current_epoch)

    trainer = _fit(CatchUp(), epochs=6)
    assert epochs == [0, 3, 4, 5] and trainer.current_epoch == 6


def test_rebuild_validation_loaders_drops_the_cached_loaders():
    identities = []

    class Rebuild(L.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == 1:
                val_loop = trainer.fit_loop.epoch_loop.val_loop
                identities.append(val_loop._combined_loader)
                rebuild_validation_loaders(trainer)
                identities.append(val_loop._combined_loader)

    _fit(Rebuild(), batches=1, epochs=2)
    assert identities[0] is not None and identities[1] is not None and identities[1] is not identities[0]


def test_set_max_steps_is_what_the_fit_loop_stops_at():
    class Raise(L.Callback):
        def on_train_start(self, trainer, pl_module):
            set_max_steps(trainer, 5)

    trainer = _fit(Raise(), batches=4, epochs=3, max_steps=2)
    assert trainer.max_steps == 5 and trainer.global_step == 5


def test_set_val_check_batch_decides_validation_after_the_batch_in_progress():
    class Validations(L.Callback):
        def __init__(self):
            self.after = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            set_val_check_batch(trainer, 1 if batch_idx == 1 else sys.maxsize)  # after the second batch only

        def on_validation_start(self, trainer, pl_module):
            self.after.append(trainer.fit_loop.epoch_loop.batch_idx)

    validations = Validations()
    _fit(validations, batches=4, num_sanity_val_steps=0)
    assert validations.after == [1]  # not at the epoch's last batch either


def test_set_default_group_timeout_sets_the_gloo_backends_timeout(single_rank_group):
    set_default_group_timeout(timedelta(seconds=42))
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    assert backend.options._timeout == timedelta(seconds=42)


def test_load_strategy_checkpoint_passes_weights_only_where_lightnings_strategy_takes_it(tmp_path):
    from lightning.pytorch.strategies import SingleDeviceStrategy

    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": {}, "epoch": 3}, path)
    strategy = SingleDeviceStrategy(torch.device("cpu"))
    assert load_strategy_checkpoint(strategy.load_checkpoint, path, None)["epoch"] == 3
    takes_it = "weights_only" in inspect.signature(strategy.load_checkpoint).parameters
    assert takes_it == LIGHTNING_2_6  # Lightning 2.6 added the parameter; a change here needs a look at the function


def test_layer_sync_requested_follows_sync_batchnorm():
    for sync in (True, False):
        trainer = L.Trainer(accelerator="cpu", devices=1, strategy="async_ps", logger=False, sync_batchnorm=sync)
        assert layer_sync_requested(trainer.strategy) is sync


def test_forget_train_dataloader_makes_the_fit_loop_load_it_again():
    loaded = []

    class Estimating(MLPClassifier):
        def configure_optimizers(self):
            assert self.trainer.estimated_stepping_batches == 8  # loads the train loader before fitting starts
            return super().configure_optimizers()

    class Forget(L.Callback):
        def on_fit_start(self, trainer, pl_module):
            loaded.append(trainer.fit_loop._combined_loader)
            forget_train_dataloader(trainer)

        def on_train_epoch_start(self, trainer, pl_module):
            loaded.append(trainer.fit_loop._combined_loader)

    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, callbacks=[Forget()], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Estimating(), datamodule=SyntheticClassificationDataModule(num_samples=64, batch_size=8))
    assert loaded[0] is not None and loaded[1] is not None and loaded[1] is not loaded[0]
