"""The settings: each bad one named, what the Trainer must offer, the BatchNorm floor, the LR rule."""

import dataclasses
import math

import lightning as L
import pytest
import torch
from torch import nn

from lightning_hetero.hetero_batch.batches import HeteroBatchSampler, SplitPlan
from lightning_hetero.hetero_batch.settings import (
    HeteroBatchAdvanced,
    HeteroBatchSettings,
    batch_floor,
    check_trainer,
    lr_scale_factor,
    model_floor,
    raised_min_batch_size,
)
from lightning_hetero.param_groups import scale_learning_rates
from lightning_hetero.synthetic import MLPClassifier

GOOD = dict(global_batch_size=64, initial_batch_sizes=None, min_batch_size=1, max_batch_size=None)
ADVANCED = dict(deadband=0.05, smoothing=0.5, rollback_tolerance=0.15, change_tolerance=0.4)


def check_settings(**settings):
    advanced = {name: settings.pop(name) for name in ADVANCED if name in settings}
    HeteroBatchSettings(**settings, advanced=HeteroBatchAdvanced(**advanced))


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ({"min_batch_size": 0}, "min_batch_size"),
        ({"max_batch_size": [4, 0]}, "max_batch_size"),
        ({"global_batch_size": 0}, "global_batch_size"),
        ({"initial_batch_sizes": [32, 0]}, "initial_batch_sizes"),
        ({"adjust_every_n_steps": 0}, "adjust_every_n_steps"),
        ({"deadband": -0.1}, "deadband"),
        ({"smoothing": float("nan")}, "smoothing"),
        ({"batch_lr_scaling": "cubic"}, "batch_lr_scaling"),
        ({"rollback_tolerance": float("inf")}, "rollback_tolerance"),
        ({"change_tolerance": 0}, "change_tolerance"),
    ],
)
def test_each_bad_setting_is_named(bad, named):
    check_settings(**GOOD | ADVANCED)
    with pytest.raises(ValueError, match=named):
        check_settings(**GOOD | ADVANCED | bad)


def test_settings_are_read_only_and_hold_sequences_as_tuples():
    settings = HeteroBatchSettings(initial_batch_sizes=[3, 13], memory_caps=[None, 8])
    assert settings.initial_batch_sizes == (3, 13) and settings.memory_caps == (None, 8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.verbose = False  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.advanced.deadband = 0.1  # type: ignore[misc]


class _Manual(MLPClassifier):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False


def _trainer() -> L.Trainer:
    return L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)


def test_manual_optimization_is_accepted_but_not_with_automatic_memory_caps():
    check_trainer(_trainer(), _Manual())  # its manual_backward is weighted by the rank's share
    check_trainer(_trainer(), _Manual(), memory_caps=[16])
    with pytest.raises(ValueError, match=r"memory_caps='auto'\) needs automatic optimization.*one size per rank"):
        check_trainer(_trainer(), _Manual(), memory_caps="auto")
    check_trainer(_trainer(), MLPClassifier(), memory_caps="auto")


@pytest.mark.parametrize(
    ("module", "floor"),
    [
        (nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)), 2),
        (nn.Sequential(nn.Linear(2, 2), nn.SyncBatchNorm(2)), 2),
        (nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2), nn.GroupNorm(1, 2)), 1),
    ],
)
def test_batch_statistics_layers_need_two_samples(module, floor):
    assert batch_floor(module) == floor


def test_the_raise_is_said_once_and_a_larger_user_setting_is_kept(caplog):
    caplog.set_level("INFO")
    assert model_floor(nn.BatchNorm1d(3), 1) == 2
    assert "min_batch_size=1 raised to 2" in caplog.text
    caplog.clear()
    model_floor(nn.BatchNorm1d(3), 4)
    assert caplog.text == ""
    assert raised_min_batch_size((1, 3), 2) == [2, 3]


@pytest.mark.parametrize(("remainder", "min_size", "last_sizes"), [(3, 1, (2, 1)), (3, 2, None), (5, 2, (3, 2))])
def test_the_epochs_last_batch_gives_every_rank_the_floor_or_joins_the_previous(remainder, min_size, last_sizes):
    plan = SplitPlan([6, 2])
    sampler = HeteroBatchSampler(list(range(16 + remainder)), plan, rank=0, shuffle=False, min_size=min_size)
    sizes = [sampler.sizes_at(0, step) for step in range(len(sampler))]
    if last_sizes is None:  # too few samples for 2 each: they join the previous global batch
        assert len(sizes) == 2 and sum(sizes[-1]) == 8 + remainder
    else:
        assert len(sizes) == 3 and sizes[-1] == last_sizes
    assert min(min(s) for s in sizes) >= min_size


def test_factors():
    assert lr_scale_factor("linear", 128, 64) == 0.5
    assert math.isclose(lr_scale_factor("sqrt", 128, 512), 2.0)
    assert lr_scale_factor(None, 1, 1000) == 1.0
    with pytest.raises(ValueError, match="lr_scaling"):
        lr_scale_factor("cubic", 1, 2)


def test_scheduler_keeps_the_scaled_rate_after_stepping():
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 1.0)
    scale_learning_rates([optimizer], [scheduler], 3.0)
    optimizer.step()
    scheduler.step()
    assert math.isclose(optimizer.param_groups[0]["lr"], 0.3)
