from datetime import timedelta

import lightning as L
import pytest
from packaging.version import Version
from torch.utils.data import DataLoader

from lightning_hetero.async_ps.runtime.trainer_limits import (
    EstimateSampler,
    TrainerLimits,
    check_trainer,
    estimating_loader,
    lock_step_interval,
    mode_switcher,
    only_lock_step,
    pool_chunks,
    steps_per_epoch,
)
from lightning_hetero.hetero_batch import HeteroBatchCallback
from lightning_hetero.switching import SyncSwitchCallback
from lightning_hetero.synthetic import MLPClassifier, make_classification


class _Manual(MLPClassifier):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False


def _trainer(**kwargs) -> L.Trainer:
    return L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, **kwargs)


TIME_BASED = pytest.mark.skipif(
    Version(L.__version__).release < (2, 6), reason="time-based val_check_interval is Lightning 2.6+"
)


@pytest.mark.parametrize(
    ("module", "mode", "trainer_kwargs", "match"),
    [
        (_Manual(), "asp", {}, r"mode='asp'\) supports manual optimization .* in BSP only"),
        (_Manual(), "local", {}, r"in BSP only.*strategy='ddp' with HeteroBatchCallback"),
        (_Manual(), "bsp", {"callbacks": [SyncSwitchCallback("bsp:0-0,asp:1-")]}, "SyncSwitchCallback would switch"),
        pytest.param(
            MLPClassifier(), "asp", {"val_check_interval": timedelta(seconds=5)}, "as a duration", marks=TIME_BASED
        ),
    ],
)
def test_refusals_name_the_setting_the_reason_and_the_alternative(module, mode, trainer_kwargs, match):
    with pytest.raises(ValueError, match=match):
        check_trainer(module, _trainer(**trainer_kwargs), mode)


def test_sync_batchnorm_is_refused_rather_than_ignored():
    trainer = _trainer(strategy="async_ps", devices=1, sync_batchnorm=True)
    with pytest.raises(ValueError, match=r"sync_batchnorm=True.*strategy='ddp'"):
        check_trainer(MLPClassifier(), trainer, "asp")


@pytest.mark.parametrize("interval", [10, 0.5])
def test_bsp_alone_takes_manual_optimization_and_mid_epoch_validation(interval):
    check_trainer(_Manual(), _trainer(val_check_interval=interval), "bsp")


def test_heterobatch_is_no_mode_switcher(recwarn):
    # its deprecated `policy` (served by __getattr__) once made BSP with HeteroBatchCallback look switched to ASP
    trainer = _trainer(callbacks=[HeteroBatchCallback()])
    assert mode_switcher(trainer) is None and only_lock_step(trainer, "bsp")
    check_trainer(_Manual(), trainer, "bsp")
    assert not [w for w in recwarn if "deprecated" in str(w.message)]
    switcher = SyncSwitchCallback("bsp:0-0,asp:1-")
    assert mode_switcher(_trainer(callbacks=[HeteroBatchCallback(), switcher])) is switcher


def test_a_fractional_interval_becomes_the_batch_count_it_means_in_bsp():
    trainer = _trainer(val_check_interval=0.25)
    lock_step_interval(trainer, batches_per_rank=12)
    assert trainer.val_check_interval == 3
    lock_step_interval(trainer, batches_per_rank=12)  # an integer stays as it is
    assert trainer.val_check_interval == 3


@pytest.mark.parametrize("limit", [0.5, 3])
def test_limit_train_batches_is_taken_over_by_the_claim_pool(limit):
    trainer = _trainer(limit_train_batches=limit)
    assert check_trainer(MLPClassifier(), trainer, "asp") == limit
    assert trainer.limit_train_batches == 1.0  # Lightning would refuse it on the claim loader (no length)


@pytest.mark.parametrize(
    ("chunks", "limit", "expected"), [(48, 1.0, 48), (48, 0.5, 24), (48, 5, 10), (48, 100, 48), (48, 0.001, 2)]
)
def test_pool_chunks_apply_a_fraction_or_a_count_per_rank_and_leave_each_rank_its_first(chunks, limit, expected):
    assert pool_chunks(chunks, limit, world_size=2) == expected


@pytest.mark.parametrize(("mode", "budget"), [("asp", 20), ("local", 20), ("bsp", 10)])
def test_max_steps_trains_what_ddps_steps_train_in_every_mode(mode, budget):
    trainer, limits = _trainer(max_steps=10), TrainerLimits()
    limits.check(MLPClassifier(), trainer, mode, world_size=2)
    assert trainer.max_steps == budget  # ASP and local SGD: an update (a step) is one rank's batch
    limits.check(MLPClassifier(), trainer, mode, world_size=2)  # a second fit keeps what the first set
    assert trainer.max_steps == budget


def test_the_step_estimate_counts_server_updates_in_asp_and_rank_steps_in_bsp():
    assert steps_per_epoch(48, world_size=2, lock_step=False) == 48
    assert steps_per_epoch(47, world_size=2, lock_step=True) == 24


@pytest.mark.parametrize(("mode", "callbacks", "per_epoch"), [("asp", [], 24), ("bsp", [], 12), ("local", [], 24)])
def test_the_estimating_loader_sizes_the_epoch_for_lightnings_estimate(mode, callbacks, per_epoch):
    trainer = _trainer(callbacks=callbacks)
    trainer.state.fn, trainer.state.stage = "fit", "train"
    loader = estimating_loader(
        DataLoader(make_classification(190), batch_size=8), trainer, mode, world_size=2, limit=1.0
    )
    assert isinstance(loader.sampler, EstimateSampler) and len(loader) == per_epoch
    with pytest.raises(RuntimeError, match="before the run started"):
        next(iter(loader))
    trainer.state.stage = "validate"
    other = DataLoader(make_classification(10), batch_size=8)
    assert estimating_loader(other, trainer, mode, world_size=2, limit=1.0) is other


def test_the_hybrid_estimate_is_the_asynchronous_one():
    trainer = _trainer(callbacks=[SyncSwitchCallback("bsp:0-0,asp:1-")])
    trainer.state.fn, trainer.state.stage = "fit", "train"
    loader = estimating_loader(DataLoader(make_classification(192), batch_size=8), trainer, "bsp", 2, limit=1.0)
    assert len(loader) == 24


def test_a_loader_the_claim_sampler_leaves_alone_gets_lightnings_own_limit_back():
    trainer = _trainer(limit_train_batches=0.5)
    limit = check_trainer(MLPClassifier(), trainer, "asp")
    trainer.state.fn, trainer.state.stage = "fit", "train"
    custom = DataLoader(make_classification(64), batch_size=8, sampler=list(range(64)))
    assert estimating_loader(custom, trainer, "asp", world_size=2, limit=limit) is custom
    assert trainer.limit_train_batches == 0.5
