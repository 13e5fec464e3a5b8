"""Each rank's batches: the split plan and sampler, the rebuilt loader, and torch.compile with changing batch sizes
(marked dynamic, one graph; too many graphs warned about, naming the rank)."""

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, IterableDataset, Sampler, TensorDataset

from lightning_hetero.allocation import apportion
from lightning_hetero.hetero_batch.batches import (
    HeteroBatchSampler,
    RecompileWatch,
    SplitPlan,
    build_hetero_loader,
    compiled_graphs,
    mark_batch_dynamic,
    starting_batch_size,
)


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


def _dataset(n=20):
    return TensorDataset(torch.arange(n, dtype=torch.float32).unsqueeze(1), torch.arange(n))


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(range(4))


class _EveryOther(Sampler[int]):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(0, self.n, 2))

    def __len__(self):
        return self.n // 2


def test_starting_batch_size_is_the_loaders_batch_size():
    assert starting_batch_size(DataLoader(_dataset(), batch_size=6, shuffle=True)) == 6
    assert starting_batch_size(DataLoader(_dataset(), batch_size=3)) == 3


@pytest.mark.parametrize(
    ("loader", "error", "message"),
    [
        ([DataLoader(_dataset()), DataLoader(_dataset())], TypeError, "a single torch DataLoader, got list"),
        (DataLoader(_Stream(), batch_size=2), TypeError, "cannot split an IterableDataset"),
        (DataLoader(_dataset(), batch_size=None), ValueError, "batch_size, which is None"),
        (DataLoader(_dataset(), batch_size=2, sampler=_EveryOther(20)), ValueError, "custom _EveryOther"),
    ],
)
def test_loaders_it_cannot_split_are_refused_naming_why(loader, error, message):
    with pytest.raises(error, match=message):
        starting_batch_size(loader)


def test_rebuilt_loaders_give_each_rank_its_slice_and_cover_the_epoch_once():
    plan = SplitPlan([3, 1])
    user = DataLoader(_dataset(), batch_size=2, shuffle=False)
    loaders = [build_hetero_loader(user, plan, rank=rank, seed=0) for rank in range(2)]
    batches = [list(loader) for loader in loaders]
    assert [len(b) for b in batches] == [5, 5], "every rank makes the same number of steps"
    assert [tuple(y.shape) for _, y in batches[0]] == [(3,)] * 5 and [tuple(y.shape) for _, y in batches[1]] == [
        (1,)
    ] * 5
    labels = sorted(int(i) for rank in batches for _, y in rank for i in y)
    assert labels == list(range(20))
    assert [int(i) for i in batches[0][0][1]] == [0, 1, 2], "unshuffled: dataset order, rank 0 first"
    assert isinstance(loaders[0].sampler, HeteroBatchSampler) and not loaders[0].sampler.shuffle


def test_rebuilt_loader_keeps_the_users_collate_fn_shuffling_and_drop_last():
    def collate(samples):
        return "collated", torch.stack([x for x, _ in samples])

    user = DataLoader(_dataset(21), batch_size=4, shuffle=True, drop_last=True, collate_fn=collate)
    loader = build_hetero_loader(user, SplitPlan([4, 4]), rank=1, seed=3)
    assert loader.sampler.shuffle and loader.sampler.seed == 3
    assert len(loader) == 2, "21 samples in global batches of 8, the partial one dropped"
    batches = list(loader)
    assert [(tag, tuple(x.shape)) for tag, x in batches] == [("collated", (4, 1))] * 2, "the user's collate_fn"
    unshuffled = list(range(4, 8)) + list(range(12, 16))  # rank 1's slices in dataset order
    assert sorted(int(v) for _, x in batches for v in x.flatten()) != unshuffled, "shuffled like the user's loader"


def test_rebuilt_loader_keeps_the_worker_settings():
    user = DataLoader(_dataset(), batch_size=2, num_workers=2, prefetch_factor=3, persistent_workers=True)
    loader = build_hetero_loader(user, SplitPlan([2, 2]), rank=0, seed=0)
    assert (loader.num_workers, loader.prefetch_factor, loader.persistent_workers) == (2, 3, True)
    assert loader.batch_size is None


def _step(x):
    return torch.tanh(x @ torch.ones(3, 2)).sum()


def test_marked_batches_of_changing_size_compile_once():
    torch._dynamo.reset()
    compiled = torch.compile(_step, backend="eager")
    watch = RecompileWatch(rank=1, bound=2)
    for size in (8, 16, 24, 40, 56):
        x = torch.ones(size, 3)
        assert mark_batch_dynamic((x, [x]), size) == 2
        compiled(x)
    assert watch.check() == 1 and not watch.warned


def test_unmarked_sizes_recompile_and_the_rank_is_named(caplog):
    torch._dynamo.reset()
    compiled = torch.compile(_step, backend="eager", dynamic=False)
    watch = RecompileWatch(rank=1, bound=2)
    before = compiled_graphs()
    for size in (8, 16, 24, 40):
        compiled(torch.ones(size, 3))
    assert compiled_graphs() - before == 4
    assert watch.check() == 4 and watch.warned
    assert "rank 1 has compiled 4 graphs" in caplog.text


def test_sizes_under_two_are_not_marked():
    assert mark_batch_dynamic({"x": torch.ones(1, 3)}, 1) == 0
