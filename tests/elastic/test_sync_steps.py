"""The synchronous elastic job's arithmetic, without processes: participants simulated, their all-reduces by sums."""

from __future__ import annotations

import pytest
import torch

from lightning_hetero.elastic import ElasticError
from lightning_hetero.elastic.sync_steps import JOINING, SyncSteps, step_split
from lightning_hetero.elastic.sync_strategy import StepSampler


def _workers(n: int, samples: int = 40, batch: int = 8, shuffle: bool = True) -> list[SyncSteps]:
    workers = [SyncSteps(samples, batch, shuffle, seed=3) for _ in range(n)]
    for worker in workers:
        worker.joining = False
    return workers


def _plans(workers: list[SyncSteps]):
    exchanged = sum(w.exchange_message(rank, len(workers)) for rank, w in enumerate(workers))
    return [w.plan(exchanged, rank, len(workers)) for rank, w in enumerate(workers)]


def _commit(workers: list[SyncSteps], plans) -> list:
    summed = sum(w.message(torch.zeros(1), None, plan) for w, plan in zip(workers, plans, strict=True))
    return [w.commit(summed, plan) for w, plan in zip(workers, plans, strict=True)]


@pytest.mark.parametrize("rates", [[1.0, 2.0, 3.0], [0.0, 0.0], [50.0, 0.0, 0.0, 10.0], [5.0, JOINING, 1.0], [0.0] * 9])
def test_a_split_trains_exactly_the_global_batch_and_a_newcomer_gets_the_slowest_share(rates):
    split = step_split(rates, 8)
    assert sum(split) == 8 and all(size >= 0 for size in split)
    assert all(size == 0 for size, rate in zip(split, rates, strict=True) if rate == JOINING)
    members = [size for size, rate in zip(split, rates, strict=True) if rate != JOINING]
    if len(members) <= 8:
        assert min(members) >= 1
    known = [rate for rate in rates if rate > 0]
    slowest = split[rates.index(min(known))] if known else None
    assert all(abs(size - slowest) <= 1 for size, rate in zip(split, rates, strict=True) if rate == 0 and known)


def test_the_shares_partition_each_global_batch_and_their_weighted_gradients_sum_to_its_gradient():
    """Each participant's local-mean gradient times its share sums to the mean gradient of the whole global batch:
    the step's gradient is exact whatever the split."""
    workers = _workers(3)
    workers[0].meter.value, workers[1].meter.value = 10.0, 30.0  # the third is not measured yet
    plans = _plans(workers)
    assert sorted(i for plan in plans for i in plan.indices) == sorted(workers[0].chunk_indices(0, 0))
    assert [len(plan.indices) for plan in plans] == list(plans[0].split) == [2, 5, 1]
    torch.manual_seed(0)
    data, target, model = torch.randn(40, 3), torch.randn(40), torch.nn.Linear(3, 1)

    def grad(indices: list[int]) -> torch.Tensor:
        model.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data[indices]).squeeze(-1), target[indices])
        loss.backward()
        return torch.cat([p.grad.reshape(-1) for p in model.parameters()])

    summed = sum(w.message(grad(plan.indices), None, plan) for w, plan in zip(workers, plans, strict=True))
    torch.testing.assert_close(summed[:-1], grad(workers[0].chunk_indices(0, 0)))
    assert summed[-1] == 8


def test_every_global_batch_is_trained_once_per_epoch_and_a_failed_step_retrains_the_same_one():
    workers = _workers(2, samples=20, batch=8)  # chunks of 8, 8 and 4 samples
    trained: list[tuple[int, int, int]] = []
    for _ in range(2):
        plans = _plans(workers)
        trained.append((plans[0].epoch, plans[0].chunk, sum(plans[0].split)))
        _commit(workers, plans)
    failed = _plans(workers)  # a participant lost: the step does not commit, nothing is counted
    again = _plans(workers[:1])  # the survivor alone trains the same global batch, whole
    assert (failed[0].chunk, again[0].chunk, again[0].split) == (2, 2, (4,))
    outcome = _commit(workers[:1], again)[0]
    assert outcome.epoch_done and outcome.samples == 4 and outcome.duplicates == 0
    assert trained == [(0, 0, 8), (0, 1, 8)] and workers[0].ledger.epoch == 1
    assert workers[0].ledger.counts.sum() == 0


def test_a_joining_worker_trains_nothing_and_a_step_of_joiners_only_is_empty():
    workers = _workers(2)
    workers[1].joining = True
    plans = _plans(workers)
    assert plans[1].indices == [] and len(plans[0].indices) == 8 and plans[1].weight == 0
    workers[0].joining = True
    assert all(plan.empty for plan in _plans(workers))


def test_two_histories_that_meet_train_nothing_and_the_smaller_group_falls_behind():
    group_a, group_bc = _workers(1), _workers(2)
    _commit(group_a, _plans(group_a))
    _commit(group_bc, _plans(group_bc))
    plans = _plans(group_a + group_bc)
    assert all(plan.diverged for plan in plans)
    assert [plan.behind for plan in plans] == [True, False, False]


def test_a_newcomer_takes_the_jobs_ledger_and_refuses_other_data():
    job, newcomer = _workers(1)[0], SyncSteps(40, 8, True, seed=3)
    _commit([job], _plans([job]))
    newcomer.load_state_dict(job.state_dict())
    assert newcomer.chunk == job.chunk == 1 and newcomer.steps_total == 1 and newcomer.history == job.history
    with pytest.raises(ElasticError, match="its data differs: num_samples is 48 here and 40 in the running job"):
        SyncSteps(48, 8, True, seed=3).load_state_dict(job.state_dict())


def test_the_loader_yields_one_placeholder_per_step_left_though_lightning_fetches_one_ahead():
    steps = _workers(1, samples=20, batch=8)[0]
    sampler = StepSampler(steps, join=lambda: None)
    batches = iter(sampler)
    fetched = [next(batches)]  # Lightning's prefetch
    while True:
        batch = next(batches, None)  # fetched while the step before runs
        sampler.consume()
        _commit([steps], _plans([steps]))
        if batch is None:
            break
        fetched.append(batch)
    assert [len(batch) for batch in fetched] == [8, 8, 4] and steps.ledger.epoch == 1
