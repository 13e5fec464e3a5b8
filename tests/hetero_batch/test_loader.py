import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler, TensorDataset

from lightning_hetero.hetero_batch.loader import build_hetero_loader, starting_batch_size
from lightning_hetero.hetero_batch.sampler import HeteroBatchSampler, SplitPlan


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
