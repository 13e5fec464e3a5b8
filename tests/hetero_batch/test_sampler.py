from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero.allocation import apportion
from lightning_hetero.hetero_batch.loader import build_hetero_loader
from lightning_hetero.hetero_batch.sampler import HeteroBatchSampler, SplitPlan


def random_split(draw, world, global_batch):
    weights = draw(st.lists(st.floats(0.1, 10.0), min_size=world, max_size=world))
    return apportion(weights, global_batch, [1] * world, [global_batch] * world)


@st.composite
def scenarios(draw):
    world = draw(st.integers(1, 4))
    global_batch = draw(st.integers(world, 24))
    size = draw(st.integers(global_batch, 120))
    epochs = draw(st.integers(1, 3))
    changes = draw(st.lists(st.integers(0, 40), max_size=5))
    splits = [random_split(draw, world, global_batch) for _ in range(len(changes) + 1)]
    shuffle = draw(st.booleans())
    drop_last = draw(st.booleans())
    return world, global_batch, size, epochs, sorted(changes), splits, shuffle, drop_last


@settings(max_examples=250, deadline=None)
@given(scenarios())
def test_every_sample_once_per_epoch_with_equal_step_counts(scenario):
    world, global_batch, size, epochs, changes, splits, shuffle, drop_last = scenario
    plan = SplitPlan(splits[0])
    for position, split in zip(changes, splits[1:], strict=False):
        plan.change_at(position, split)
    samplers = [
        HeteroBatchSampler(range(size), plan, rank, shuffle=shuffle, seed=7, drop_last=drop_last)
        for rank in range(world)
    ]
    for epoch in range(epochs):
        for sampler in samplers:
            sampler.set_epoch(epoch)
        per_rank = [list(sampler) for sampler in samplers]
        assert len({len(batches) for batches in per_rank}) == 1, "ranks must do the same number of steps"
        steps = len(per_rank[0])
        assert steps == len(samplers[0])
        for step in range(steps):
            sizes = samplers[0].sizes_at(epoch, step)
            assert [len(per_rank[rank][step]) for rank in range(world)] == list(sizes)
            assert all(b >= 1 for b in sizes)
            if step < steps - 1:
                assert tuple(sizes) == plan.split_at(epoch * steps + step)
        counts = Counter(i for batches in per_rank for batch in batches for i in batch)
        assert max(counts.values()) == 1, "no sample may be used twice"
        dropped = size - len(counts)
        assert dropped == (size % global_batch if drop_last else 0)


def test_permutation_changes_with_epoch_and_is_identical_across_ranks():
    plan = SplitPlan([4, 4])
    a, b = (HeteroBatchSampler(range(64), plan, rank, shuffle=True, seed=1) for rank in range(2))
    first = [list(a), list(b)]
    a.set_epoch(1)
    b.set_epoch(1)
    second = [list(a), list(b)]
    assert first != second
    assert sorted(i for batches in first for batch in batches for i in batch) == list(range(64))


def test_small_remainder_joins_the_previous_global_batch():
    plan = SplitPlan([6, 2])
    samplers = [HeteroBatchSampler(range(17), plan, rank, shuffle=False) for rank in range(2)]
    assert len(samplers[0]) == 2
    assert [list(s)[-1] for s in samplers] == [[8, 9, 10, 11, 12, 13, 14], [15, 16]]


def test_dataset_smaller_than_one_global_batch_is_an_error():
    with pytest.raises(ValueError, match="smaller than one global batch"):
        HeteroBatchSampler(range(10), SplitPlan([8, 8]), rank=0)


def test_plan_rejects_changes_in_the_past_or_of_another_global_batch():
    plan = SplitPlan([4, 4])
    plan.change_at(10, [6, 2])
    with pytest.raises(ValueError, match="before the last change"):
        plan.change_at(5, [2, 6])
    with pytest.raises(ValueError, match="global batch"):
        plan.change_at(12, [6, 6])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_mid_epoch_changes_stay_consistent_under_dataloader_prefetching(num_workers):
    """Two ranks' loaders prefetch ahead; a change scheduled after every rank's produced position is still
    applied to the same step on both, so each global batch is covered exactly once."""
    dataset = TensorDataset(torch.arange(400))
    user_loader = DataLoader(dataset, batch_size=10, shuffle=True, num_workers=num_workers)
    plans = [SplitPlan([10, 10]), SplitPlan([10, 10])]
    loaders = [build_hetero_loader(user_loader, plans[rank], rank=rank, seed=3) for rank in range(2)]
    iterators = [iter(loader) for loader in loaders]
    seen: list[int] = []
    new_splits = [(14, 6), (5, 15), (11, 9)]
    for step in range(len(loaders[0])):
        batches = [next(iterator)[0] for iterator in iterators]
        for rank, loader in enumerate(loaders):
            assert len(batches[rank]) == loader.sampler.sizes_at(0, step)[rank]
        seen.extend(torch.cat(batches).tolist())
        if step in (2, 7, 12):
            position = max(loader.sampler.produced_position for loader in loaders) + 1
            split = new_splits.pop(0)
            for plan in plans:
                plan.change_at(position, split)
    assert sorted(seen) == list(range(400))
    assert not new_splits


def test_next_sizes_pairs_each_delivered_batch_with_its_split():
    plan = SplitPlan([5, 3])
    sampler = HeteroBatchSampler(range(40), plan, rank=1, shuffle=False)
    abandoned = iter(sampler)
    next(abandoned)  # an iterator Lightning creates and drops must not leave sizes behind
    plan.change_at(2, [2, 6])
    batches = list(sampler)
    assert [sampler.next_sizes() for _ in batches] == [(5, 3), (5, 3), (2, 6), (2, 6), (2, 6)]
    assert [len(batch) for batch in batches] == [3, 3, 6, 6, 6]
    with pytest.raises(IndexError):
        sampler.next_sizes()


def test_the_old_name_of_change_at_still_works_with_a_deprecation_warning():
    plan = SplitPlan([4, 4])
    with pytest.deprecated_call(match=r"SplitPlan.schedule is deprecated"):
        plan.schedule(3, [6, 2])
    assert plan.split_at(2) == (4, 4) and plan.split_at(3) == (6, 2)
