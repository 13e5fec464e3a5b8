"""Elastic rounds played in one process: the all-reduce is a sum over the workers present, and workers leave and
join between rounds. Every chunk must be trained exactly once per epoch, and the workers' parameters must agree."""

import random

import torch

from lightning_hetero.elastic.rounds import ElasticRounds
from lightning_hetero.local_sgd.outer_optimizer import OuterOptimizer

NUM_CHUNKS = 40


def _worker() -> tuple[ElasticRounds, torch.Tensor]:
    return ElasticRounds(NUM_CHUNKS, 2, OuterOptimizer(torch.optim.SGD, {"lr": 1.0})), torch.zeros(3)


def _round_end(workers, commit=True):
    """The round-end all-reduce (a sum) over the workers present, then commit (the results) or roll back on each."""
    ids = sorted(workers)
    summed = sum(workers[w][0].message(workers[w][1], None, rank, len(ids)) for rank, w in enumerate(ids))
    results = []
    for rank, w in enumerate(ids):
        rounds, flat = workers[w]
        if commit:
            results.append(rounds.commit(summed.clone(), flat, None, rank, len(ids)))
        else:
            rounds.rollback(flat)
    return results


def _train_some(workers, rng):
    """Each worker trains up to its quota (sometimes less: a round cut short)."""
    for rounds, flat in workers.values():
        for _ in range(rng.randint(0, rounds.quota)):
            chunk = rounds.take()
            if chunk is None:
                break
            flat += 0.01
            rounds.record_step(chunk, samples=4, step_s=0.01 * rng.uniform(1, 4))


def test_workers_leave_and_join_and_every_chunk_is_trained_once_per_epoch():
    rng = random.Random(0)
    workers = {0: _worker(), 1: _worker()}
    for rounds, flat in workers.values():
        rounds.begin(flat)
    _round_end(workers)
    committed: dict[int, list[int]] = {}
    events = {"died": 0, "failed": 0, "joined": 0}
    next_id = 2
    for _ in range(200):
        _train_some(workers, rng)
        event = rng.random()
        if event < 0.1 and len(workers) > 1:  # a worker dies mid-round: its round is lost, its chunks held by nobody
            del workers[rng.choice(sorted(workers))]
            events["died"] += 1
        trained = [(r.ledger.epoch, list(r.trained)) for r, _ in workers.values()]
        if event > 0.93:  # the all-reduce failed: nothing commits
            _round_end(workers, commit=False)
            events["failed"] += 1
            continue
        _round_end(workers)
        for epoch, chunks in trained:
            committed.setdefault(epoch, []).extend(chunks)
        if event > 0.85:  # a newcomer joins at the next round end, with a peer's state
            peer_rounds, peer_flat = workers[min(workers)]
            rounds, flat = _worker()
            flat.copy_(peer_flat)
            rounds.load_state_dict(peer_rounds.state_dict(), flat)
            workers[next_id] = (rounds, flat)
            next_id += 1
            events["joined"] += 1
            _round_end(workers)
    assert min(events.values()) >= 5, events
    flats = [flat for _, flat in workers.values()]
    assert all(torch.equal(flats[0], flat) for flat in flats)
    epochs_done = min(r.ledger.epoch for r, _ in workers.values())
    assert epochs_done >= 3
    for epoch in range(epochs_done):
        assert sorted(committed[epoch]) == list(range(NUM_CHUNKS)), epoch
    assert all(r.ledger.duplicates == 0 for r, _ in workers.values())


def test_a_failed_round_rolls_back_and_trains_its_chunks_again():
    rounds, flat = _worker()
    rounds.begin(flat)
    rounds.queue.extend([5, 6])
    chunk = rounds.take()
    flat += 1.0
    rounds.record_step(chunk, samples=4, step_s=0.1)
    rounds.rollback(flat)
    assert torch.equal(flat, torch.zeros(3))
    assert list(rounds.queue) == [5, 6] and rounds.trained == []


def test_a_recovering_worker_drops_the_chunks_it_held_and_its_fetched_batch_trains_idle():
    peer, peer_flat = _worker()
    peer.begin(peer_flat)
    peer.ledger.commit(torch.tensor([1.0] * 3 + [0.0] * (NUM_CHUNKS - 3)))
    rounds, flat = _worker()
    rounds.begin(flat)
    rounds.queue.extend([4, 7])
    fetched = rounds.take()
    rounds.load_state_dict(peer.state_dict(), flat)
    assert list(rounds.queue) == [] and rounds.held == [] and rounds.ledger.counts[:3].tolist() == [1, 1, 1]
    assert rounds.dropped(fetched) and not rounds.dropped(fetched)


def test_two_groups_that_committed_the_same_steps_apart_never_commit_a_chunk_twice():
    """The benchmark's duplicates (join_timeout_s=2): the first worker's join round formed with it alone, the three
    started after it formed theirs without it (they waited join_timeout_s while it trained); both groups committed step
    1 from their own ledgers and handed the same chunks out. When three of them met in one round, torchft recovered
    nobody (equal steps) and the chunks both groups trained committed twice."""
    num_chunks = 100
    a, b, c, d = (
        (ElasticRounds(num_chunks, 16, OuterOptimizer(torch.optim.SGD, {"lr": 1.0})), torch.zeros(3)) for _ in range(4)
    )
    for rounds, flat in (a, b, c, d):
        rounds.begin(flat)
    _round_end({0: a})
    _round_end({1: b, 2: c, 3: d})
    assert list(a[0].queue) == list(range(9)) and list(c[0].queue)[:3] == [1, 4, 7]  # the same chunks, twice
    committed: list[int] = []
    for rounds, flat in (a, c, d):  # b is late and left out of the round end
        committed += _train_quota(rounds, flat)
    results = _round_end({0: a, 2: c, 3: d})
    assert all(rounds.ledger.duplicates == 0 and int(rounds.ledger.counts.max()) == 0 for rounds, _ in (a, c, d))
    assert [(r.diverged, r.behind) for r in results] == [(True, True), (True, False), (True, False)]
    assert all(torch.equal(flat, torch.zeros(3)) for _, flat in (a, c, d))  # every participant rolled back
    # a falls behind and torchft recovers it from a peer of the group that won (c, d and b)
    a[1].copy_(c[1])
    a[0].load_state_dict(c[0].state_dict(), a[1])
    workers = {0: a, 1: b, 2: c, 3: d}
    committed = []
    while all(rounds.ledger.epoch == 0 for rounds, _ in workers.values()):
        trained = [chunk for rounds, flat in workers.values() for chunk in _train_quota(rounds, flat)]
        assert not any(r.diverged for r in _round_end(workers))
        committed += trained
    assert sorted(committed) == list(range(num_chunks))
    assert all(rounds.ledger.duplicates == 0 for rounds, _ in workers.values())
    assert len({rounds.history for rounds, _ in workers.values()}) == 1


def _train_quota(rounds: ElasticRounds, flat: torch.Tensor) -> list[int]:
    trained = []
    for _ in range(rounds.quota):
        chunk = rounds.take()
        if chunk is None:
            break
        flat += 0.01
        rounds.record_step(chunk, samples=4, step_s=0.01)
        trained.append(chunk)
    return trained
