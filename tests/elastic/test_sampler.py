from collections import deque

import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero.elastic.rounds import ElasticRounds
from lightning_hetero.elastic.sampler import IDLE, ElasticBatchSampler, elastic_loader
from lightning_hetero.local_sgd.outer_optimizer import OuterOptimizer


def _rounds(num_chunks: int) -> ElasticRounds:
    return ElasticRounds(num_chunks, 1, OuterOptimizer())


def test_batches_follow_the_assigned_chunks_then_idle_until_the_epoch_completes():
    rounds = _rounds(3)
    rounds.queue.extend([1])
    sampler = ElasticBatchSampler(rounds, num_samples=6, batch_size=2, shuffle=True, seed=3)
    batches = iter(sampler)
    first = next(batches)
    assert len(first) == 2 and rounds.held == [1]
    assert next(batches) == next(batches)  # idle batches repeat one batch and take nothing
    assert [sampler.next_chunk() for _ in range(3)] == [1, IDLE, IDLE]
    rounds.ledger.next_epoch()  # the round that completed the epoch
    assert list(batches) == []


def test_the_loader_keeps_the_dataset_and_refuses_nothing_plain():
    data = TensorDataset(torch.arange(10.0))
    built = elastic_loader(DataLoader(data, batch_size=4, shuffle=True), _rounds(3))
    assert built is not None
    loader, sampler = built
    assert loader.dataset is data and sampler.shuffle and sampler.batch_size == 4
    assert sampler.chunk_samples(2) == 2  # the epoch's short last batch
    assert elastic_loader(DataLoader(data, batch_size=None), _rounds(3)) is None
    assert elastic_loader(DataLoader(data, batch_size=2, sampler=[0, 1]), _rounds(3)) is None


def test_a_new_iteration_gives_back_the_chunks_an_abandoned_one_fetched():
    rounds = _rounds(4)
    rounds.queue.extend([2, 3])
    sampler = ElasticBatchSampler(rounds, num_samples=8, batch_size=2, shuffle=False, seed=0)
    next(iter(sampler))  # fetched chunk 2, never trained: Lightning started the epoch's iteration again
    assert rounds.taken == deque([2])
    assert next(iter(sampler)) == [4, 5] and list(sampler.pending) == [2]
