import torch
from torch.utils.data import DataLoader, DistributedSampler, SequentialSampler

from lightning_hetero.async_ps.runtime.sampler import epoch_order as ps_epoch_order
from lightning_hetero.epoch_order import epoch_order, sampler_order
from lightning_hetero.hetero_batch import HeteroBatchSampler, SplitPlan


def test_epoch_order_changes_with_epoch_and_is_shared():
    assert epoch_order(50, 1, True, 3) == epoch_order(50, 1, True, 3)
    assert epoch_order(50, 1, True, 3) != epoch_order(50, 2, True, 3)
    assert sorted(epoch_order(50, 2, True, 3)) == list(range(50))


def test_the_hetero_batch_sampler_cuts_the_same_order_the_ps_sampler_claims_from():
    sampler = HeteroBatchSampler(list(range(24)), SplitPlan([4, 4]), rank=0, shuffle=True, seed=7)
    sampler.set_epoch(2)
    first_slices = [batch for batch in sampler]
    order = epoch_order(24, epoch=2, shuffle=True, seed=7)
    assert first_slices == [order[start : start + 4] for start in range(0, 24, 8)]
    assert ps_epoch_order is epoch_order, "the old import path still works"


def test_sampler_order_keeps_the_shuffle_and_seed_of_samplers_it_may_replace(monkeypatch):
    data = list(range(8))
    assert sampler_order(DistributedSampler(data, num_replicas=2, rank=0, shuffle=False, seed=3)) == (False, 3)
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    assert sampler_order(DataLoader(data, shuffle=True).sampler) == (True, 0)
    assert sampler_order(SequentialSampler(data)) == (False, 0)
    assert sampler_order([0, 1]) is None


def test_a_plain_random_samplers_order_follows_the_users_seed(monkeypatch):
    """As Lightning seeds the DistributedSampler it injects: ``seed_everything``'s seed, or the loader's generator."""
    data = list(range(8))
    monkeypatch.setenv("PL_GLOBAL_SEED", "5")  # what seed_everything(5) sets
    assert sampler_order(DataLoader(data, shuffle=True).sampler) == (True, 5)
    generator = torch.Generator().manual_seed(11)
    assert sampler_order(DataLoader(data, shuffle=True, generator=generator).sampler) == (True, 11)
