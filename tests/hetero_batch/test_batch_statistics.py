import pytest
from torch import nn

from lightning_hetero.hetero_batch.batch_statistics import batch_floor, model_floor, raised_min_batch_size
from lightning_hetero.hetero_batch.sampler import HeteroBatchSampler, SplitPlan


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
