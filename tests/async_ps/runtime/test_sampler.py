import heapq
import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_hetero.async_ps.runtime.sampler import (
    ClaimSampler,
    epoch_order,
    round_robin_chunks,
    stops_claiming,
    tail_claim,
)


class Counter:
    def __init__(self) -> None:
        self.values: dict[int | tuple[int, int], int] = {}

    def claim(self, epoch: int, count: int, segment: int = 0) -> int:
        key = epoch if segment == 0 else (epoch, segment)
        start = self.values.get(key, 0)
        self.values[key] = start + count
        return start


def drain_at_random_speeds(samplers, chunk, seed, on_batch=lambda rank, batch: None):
    """Each rank's indices when the ranks draw batches in a random interleaving (workers of random speeds)."""
    iterators = [iter(s) for s in samplers]
    seen: list[list[int]] = [[] for _ in samplers]
    rng = random.Random(seed)
    live = list(range(len(samplers)))
    while live:
        rank = rng.choice(live)
        batch = list(itertools.islice(iterators[rank], chunk))
        if not batch:
            live.remove(rank)
            continue
        on_batch(rank, batch)
        seen[rank].extend(batch)
    return seen


@given(
    num_samples=st.integers(1, 200),
    chunk=st.integers(1, 17),
    world=st.integers(1, 4),
    seed=st.integers(0, 10_000),
)
def test_asynchronous_claims_cover_the_epoch_exactly_once(num_samples, chunk, world, seed):
    counter = Counter()
    samplers = [
        ClaimSampler(num_samples, chunk, counter.claim, lambda: 2, lambda: True, rank, world, shuffle=True, seed=5)
        for rank in range(world)
    ]
    seen = drain_at_random_speeds(samplers, chunk, seed)
    everything = sorted(i for indices in seen for i in indices)
    assert everything == list(range(num_samples))
    if num_samples >= world * chunk:
        assert all(len(indices) >= chunk for indices in seen)  # everybody trains at least one batch


@given(
    num_samples=st.integers(1, 300),
    chunk=st.integers(1, 9),
    world=st.integers(1, 4),
    claim_chunks=st.lists(st.integers(1, 12), min_size=4, max_size=4),
    seed=st.integers(0, 10_000),
)
def test_claiming_several_chunks_at_once_still_covers_the_epoch_exactly_once(
    num_samples, chunk, world, claim_chunks, seed
):
    counter = Counter()
    samplers = [
        ClaimSampler(num_samples, chunk, counter.claim, lambda: 0, lambda: True, rank, world) for rank in range(world)
    ]
    for sampler, chunks in zip(samplers, claim_chunks, strict=False):
        sampler.claim_chunks = chunks

    def check(rank, batch):
        assert samplers[rank].next_chunk() == batch[0] // chunk  # the batch's chunk, as local SGD reads it
        if rank % 2:  # ASP resizes its claims at every batch (async_ps/runtime/claim_size.py)
            samplers[rank].claim_chunks = 1 + (batch[0] // chunk) % claim_chunks[rank]

    seen = drain_at_random_speeds(samplers, chunk, seed, on_batch=check)
    assert sorted(i for indices in seen for i in indices) == list(range(num_samples))


def test_claims_of_several_chunks_save_round_trips_and_shrink_near_the_epochs_end():
    claims: list[int] = []
    counter = Counter()

    def claim(epoch: int, count: int) -> int:
        claims.append(count // 4)
        return counter.claim(epoch, count)

    sampler = ClaimSampler(400, 4, claim, lambda: 0, lambda: True, rank=0, world_size=2)
    sampler.claim_chunks = 8
    assert list(sampler) == list(range(0, 4)) + list(range(8, 400))  # rank 1's reserved chunk left out
    # 98 chunks after the reserved ones: 8 at a time while 32 or more are left (a claim takes at most a quarter, 1 / (2
    # x world), of what is left), then fewer, down to single chunks; the last claim finds the pool empty
    assert claims == [8] * 9 + [6, 5, 3, 3, 2] + [1] * 8
    assert sum(claims[:-1]) == 98
    assert sampler.samples_left == 0


def test_near_the_epochs_end_a_slow_rank_claims_by_its_share_of_the_speed():
    def claims_of(share):
        claims: list[int] = []
        counter = Counter()

        def claim(epoch: int, count: int) -> int:
            claims.append(count // 4)
            return counter.claim(epoch, count)

        sampler = ClaimSampler(400, 4, claim, lambda: 0, lambda: True, rank=3, world_size=4)
        sampler.claim_chunks, sampler.claim_share = 8, share
        indices = list(sampler)
        assert len(indices) == 4 + 4 * sum(claims[:-1])  # its reserved chunk and what it claimed, once each
        return claims

    # 96 chunks after the 4 reserved: equal shares (1 / 4) cap a claim at an eighth of what is left; a rank with a
    # tenth of the ranks' speed claims at most a twentieth, so it holds no more than it trains while the rest drain
    assert claims_of(None) == claims_of(0.25) == [8] * 5 + [7, 6, 5, 4, 4, 3, 3, 3, 2, 2, 2] + [1] * 16
    assert claims_of(0.1) == [4] * 5 + [3] * 6 + [2] * 10 + [1] * 39
    assert claims_of(1.0) == [8] * 11 + [4, 2, 1, 1, 1]  # a rank with all the speed keeps its round's claims longer


@given(
    num_samples=st.integers(1, 300),
    chunk=st.integers(1, 9),
    rates=st.lists(st.floats(0.1, 10.0), min_size=1, max_size=4),
    seed=st.integers(0, 10_000),
)
def test_slower_ranks_that_stop_claiming_early_still_leave_the_epoch_covered_exactly_once(
    num_samples, chunk, rates, seed
):
    counter = Counter()
    world = len(rates)
    samplers = [
        ClaimSampler(num_samples, chunk, counter.claim, lambda: 0, lambda: True, k, world) for k in range(world)
    ]
    for k, sampler in enumerate(samplers):
        sampler.claim_chunks = 3
        sampler.claim_share, sampler.lead_share = rates[k] / sum(rates), max(rates) / sum(rates)

    seen = drain_at_random_speeds(samplers, chunk, seed, on_batch=lambda rank, batch: samplers[rank].next_chunk())
    assert sorted(i for indices in seen for i in indices) == list(range(num_samples))


def drain_in_time(steps: list[float], chunks: int, lead: bool) -> list[float]:
    """When each rank trains its last batch of a pool of ``chunks`` batches, the ranks' steps taking ``steps`` and
    each fetching a batch ahead, as Lightning's loop does."""
    counter = Counter()
    shares = [(1 / s) / sum(1 / t for t in steps) for s in steps]
    samplers = [
        ClaimSampler(chunks * 4, 4, counter.claim, lambda: 0, lambda: True, k, len(steps)) for k in range(len(steps))
    ]
    for sampler, share in zip(samplers, shares, strict=True):
        sampler.claim_chunks, sampler.claim_share, sampler.lead_share = 2, share, max(shares) if lead else None
    iterators = [iter(sampler) for sampler in samplers]
    held = [list(itertools.islice(it, 4)) for it in iterators]
    events, finish = [(0.0, k) for k in range(len(steps))], [0.0] * len(steps)
    while events:
        now, k = heapq.heappop(events)
        if not held[k]:
            finish[k] = now
            continue
        held[k] = list(itertools.islice(iterators[k], 4))  # fetch batch n + 1, then train n
        samplers[k].next_chunk()
        heapq.heappush(events, (now + steps[k], k))
    return finish


@pytest.mark.parametrize("steps", [[3.3, 8.0, 13.0, 20.0], [1.0, 1.0, 2.0, 4.0], [1.0, 4.0]])
def test_slower_ranks_stop_claiming_so_that_the_faster_ones_do_not_wait_for_them_at_the_epochs_end(steps):
    def waits(lead):  # batches the ranks could have trained while waiting for the last one
        finish = drain_in_time(steps, 64, lead)
        return sum((max(finish) - end) / step for end, step in zip(finish, steps, strict=True))

    # claiming until the pool is empty, a slow rank finishes its last batches up to two of its steps after the others
    assert waits(lead=False) >= 6
    assert waits(lead=True) <= 3 and waits(lead=True) < waits(lead=False) / 2


@given(
    held=st.integers(0, 3),
    left=st.integers(0, 10_000),
    world=st.integers(2, 8),
    share=st.floats(0.01, 1.0),
    lead=st.floats(0.01, 1.0),
)
def test_a_rank_stops_claiming_only_when_slower_than_the_fastest_and_only_near_the_pools_end(
    held, left, world, share, lead
):
    stops = stops_claiming(held, left, 32, world, share, lead)
    if share >= lead:
        assert not stops
    if stops:  # its share of the work left is under the batches it would then hold
        assert share * (left + (held + 1.5 * (world - 1)) * 32) < (held + 1) * 32
    if share < lead and share * left >= (held + 1) * 32:  # its share of the pool alone holds another batch
        assert not stops


@given(
    claim_chunks=st.integers(1, 64),
    left=st.integers(0, 10_000),
    chunk=st.integers(1, 64),
    world=st.integers(1, 8),
    share=st.one_of(st.none(), st.floats(0.01, 1.0)),
)
def test_a_tail_claim_is_at_least_one_at_most_the_rounds_and_half_the_ranks_share_of_what_is_left(
    claim_chunks, left, chunk, world, share
):
    count = tail_claim(claim_chunks, left, chunk, world, share)
    assert 1 <= count <= claim_chunks
    assert count == 1 or count * chunk <= left * (1 / world if share is None else share) / 2 + 1e-6


@given(
    chunks=st.integers(4, 40),
    world=st.integers(1, 4),
    cuts=st.sets(st.integers(1, 39), max_size=4),
    claim_chunks=st.integers(1, 5),
    seed=st.integers(0, 10_000),
)
def test_validation_segments_are_claimed_like_epochs_and_each_rank_sees_every_segments_end(
    chunks, world, cuts, claim_chunks, seed
):
    starts = sorted(c for c in cuts if world <= c <= chunks - world)  # segments of a batch per rank at least
    starts = [c for i, c in enumerate(starts) if i == 0 or c - starts[i - 1] >= world]
    counter = Counter()
    samplers = [
        ClaimSampler(chunks * 3, 3, counter.claim, lambda: 1, lambda: True, rank, world) for rank in range(world)
    ]
    iterators = []
    for sampler in samplers:
        sampler.segments = lambda epoch: starts
        sampler.claim_chunks = claim_chunks
        iterators.append(iter(sampler))
    # Lightning's loader holds the next batch while one is trained: a rank fetches batch n + 1, then trains n
    held = [list(itertools.islice(iterator, 3)) for iterator in iterators]
    trained: list[list[int]] = [[] for _ in samplers]
    ends: list[list[int]] = [[] for _ in samplers]
    rng, live = random.Random(seed), list(range(world))
    while live:
        rank = rng.choice(live)
        batch, held[rank] = held[rank], list(itertools.islice(iterators[rank], 3))
        if not batch:
            live.remove(rank)
            continue
        chunk = samplers[rank].next_chunk()
        assert chunk == batch[0] // 3
        trained[rank].append(chunk)
        if samplers[rank].segment_ended():
            ends[rank].append(chunk)
    assert sorted(c for mine in trained for c in mine) == list(range(chunks))  # every batch once
    bounds = [0, *starts, chunks]
    for mine, my_ends in zip(trained, ends, strict=True):
        segments = [next(i for i in range(len(starts) + 1) if c < bounds[i + 1]) for c in mine]
        assert segments == sorted(segments) and set(segments) == set(range(len(starts) + 1))  # in order, none skipped
        # a validation point after the rank's last batch of each segment but the last, and nowhere else
        assert my_ends == [mine[len(segments) - 1 - segments[::-1].index(i)] for i in range(len(starts))]


def test_closing_the_pool_claims_every_segment_and_leaves_each_rank_its_reserved_batches():
    counter = Counter()
    sampler = ClaimSampler(24, 2, counter.claim, lambda: 0, lambda: True, rank=1, world_size=2)
    sampler.segments = lambda epoch: [4, 8]  # three segments of 4 chunks
    iterator = iter(sampler)
    assert list(itertools.islice(iterator, 2)) == [2, 3]  # the reserved chunk of the first segment
    sampler.close(0)
    assert list(iterator) == [10, 11, 18, 19]  # the reserved chunks of the other two, nothing claimed


def test_the_position_at_a_validation_point_resumes_the_epoch_at_the_next_segment_and_nothing_else():
    def samplers(counter):
        made = [ClaimSampler(24, 2, counter.claim, lambda: 3, lambda: True, rank, world_size=2) for rank in (0, 1)]
        for sampler in made:
            sampler.segments = lambda epoch: [4, 8]  # three segments of 4 chunks
        return made

    counter = Counter()
    ranks = samplers(counter)
    iterators = [iter(sampler) for sampler in ranks]
    held = [list(itertools.islice(iterator, 2)) for iterator in iterators]  # the loader holds the next batch
    trained: list[int] = []
    positions = []
    for rank in [0, 1, 0, 1]:  # the first segment, then each rank's last batch of it: a validation point
        trained += held[rank]
        held[rank] = list(itertools.islice(iterators[rank], 2))
        ranks[rank].next_chunk()
        positions.append(ranks[rank].position())
    assert positions[:2] == [None, None] and positions[2:] == [{"epoch": 3, "sample": 8}] * 2
    resumed = samplers(Counter())
    for sampler, position in zip(resumed, positions[2:], strict=True):
        sampler.resume_from(position)
    again = [list(sampler) for sampler in resumed]
    assert sorted(trained + again[0] + again[1]) == list(range(24))  # every index once
    assert resumed[1].position() is None  # at the epoch's end
    restarted = samplers(Counter())
    for sampler in restarted:
        sampler.resume_from({"epoch": 2, "sample": 8})  # another epoch's position: this one starts from its beginning
    assert sorted(list(restarted[0]) + list(restarted[1])) == list(range(24))


def test_a_position_that_is_no_segments_start_starts_the_epoch_again():
    sampler = ClaimSampler(24, 2, Counter().claim, lambda: 0, lambda: True, rank=0, world_size=1)
    sampler.segments = lambda epoch: [6]  # another val_check_interval than the checkpoint's
    sampler.resume_from({"epoch": 0, "sample": 8})
    with pytest.warns(UserWarning, match="starts again"):
        assert list(sampler) == list(range(24))
    sampler.resume_from({"epoch": 0, "sample": 13})  # another batch size than the checkpoint's
    with pytest.warns(UserWarning, match="starts again"):
        assert list(iter(sampler))[:2] == [0, 1]


def test_samples_left_follow_the_counter_as_this_rank_saw_it():
    counter = Counter()
    sampler = ClaimSampler(100, 10, counter.claim, lambda: 0, lambda: True, rank=0, world_size=2)
    iterator = iter(sampler)
    next(iterator)
    assert sampler.samples_left == 80  # two reserved chunks
    counter.claim(0, 30)  # the other rank claims 3 chunks: not seen yet
    list(itertools.islice(iterator, 10))  # this rank's next claim: the counter is at 20 + 40
    assert sampler.samples_left == 40


def test_synchronous_mode_deals_equal_numbers_of_chunks():
    counter = Counter()
    per_rank = []
    for rank in range(3):
        sampler = ClaimSampler(100, 8, counter.claim, lambda: 0, lambda: False, rank, 3)
        per_rank.append(list(sampler))
    assert counter.values == {}
    chunks = [round_robin_chunks(100, 8, rank, 3) for rank in range(3)]
    assert len({len(c) for c in chunks}) == 1
    assert set().union(*map(set, per_rank)) == set(range(100))


@given(
    num_samples=st.integers(1, 200),
    chunk=st.integers(1, 17),
    world=st.integers(2, 4),
    seed=st.integers(0, 10_000),
)
def test_chunks_of_workers_lost_mid_epoch_are_taken_by_rank_0_at_its_end(num_samples, chunk, world, seed):
    """Workers 1.. may die holding a batch (claimed, not pushed); rank 0, once the others are done or lost, takes
    every chunk nobody pushed, so what was pushed plus rank 0's batches still covers the epoch exactly once."""
    counter = Counter()
    rng = random.Random(seed)
    num_chunks = -(-num_samples // chunk)
    pushed_chunks: set[int] = set()
    trained: list[int] = []
    others = list(range(1, world))

    def step(rank: int) -> bool:
        batch = list(itertools.islice(iterators[rank], chunk))
        if not batch:
            return False
        taken = samplers[rank].next_chunk()
        if rank != 0 and rng.random() < 0.2:
            others.remove(rank)  # dies with the batch in hand
            return False
        pushed_chunks.add(taken)
        trained.extend(batch)
        return True

    def tail(epoch: int, own: set[int]) -> list[int]:
        while others:  # rank 0 waits until every other worker pushed its last batch or was lost
            rank = rng.choice(others)
            if not step(rank) and rank in others:
                others.remove(rank)
        return sorted(set(range(num_chunks)) - pushed_chunks - own)

    samplers = [
        ClaimSampler(
            num_samples, chunk, counter.claim, lambda: 0, lambda: True, rank, world, tail=tail if rank == 0 else None
        )
        for rank in range(world)
    ]
    iterators = [iter(s) for s in samplers]
    while step(0) or others:
        if others:
            rank = rng.choice(others)
            if not step(rank) and rank in others:
                others.remove(rank)
    assert sorted(trained) == list(range(num_samples))


@given(
    num_samples=st.integers(1, 200),
    chunk=st.integers(1, 17),
    world=st.integers(2, 4),
    seed=st.integers(0, 10_000),
)
def test_a_dedicated_server_rank_yields_its_reserved_chunk_only_and_the_others_cover_the_rest(
    num_samples, chunk, world, seed
):
    counter = Counter()
    tail_calls = []

    def tail(epoch, own):
        tail_calls.append((epoch, set(own)))
        return []

    samplers = [
        ClaimSampler(
            num_samples, chunk, counter.claim, lambda: 1, lambda: True, rank, world, shuffle=True, seed=5,
            tail=tail if rank == 0 else None, reserved_only=lambda rank=rank: rank == 0,
        )
        for rank in range(world)
    ]  # fmt: skip
    seen = drain_at_random_speeds(samplers, chunk, seed)
    assert sorted(i for indices in seen for i in indices) == list(range(num_samples))
    assert len(seen[0]) == min(chunk, num_samples)  # rank 0: chunk 0 only, never a claim
    assert tail_calls == [(1, {0})]  # asked once, after its reserved chunk


@pytest.mark.parametrize("asynchronous", [True, False])
def test_a_limited_pool_covers_the_first_chunks_of_the_epochs_order_once(asynchronous):
    counter: dict[int, int] = {}

    def claim(epoch, count):
        start = counter.get(epoch, 0)
        counter[epoch] = start + count
        return start

    samplers = [
        ClaimSampler(
            50, 4, claim, epoch=lambda: 2, asynchronous=lambda: asynchronous, rank=rank, world_size=2, shuffle=True,
            pool_chunks=5,
        )
        for rank in (0, 1)
    ]  # fmt: skip
    seen = [i for sampler in samplers for i in sampler]
    first = epoch_order(50, 2, True, 0)[:20]
    assert (sorted(seen) if asynchronous else sorted(set(seen))) == sorted(first)  # BSP pads by wrapping
    assert samplers[0].epoch_samples == 20


def test_a_closed_pool_ends_the_ranks_claim_at_once_and_keeps_later_segments_reserved_batches():
    counter = Counter()
    sampler = ClaimSampler(40 * 2, 2, counter.claim, lambda: 0, lambda: True, rank=0, world_size=2)
    sampler.segments = lambda epoch: [20]  # a validation point halfway
    sampler.claim_chunks = 8
    iterator = iter(sampler)
    first = [next(iterator) for _ in range(2 * 3)]  # the reserved chunk and two of a claim of 4 (a quarter of 18)
    sampler.close(0)  # a stop (max_steps reached): the claim's other 2 chunks are left untrained
    rest = list(iterator)
    assert first == [0, 1, 4, 5, 6, 7]
    assert rest == [40, 41]  # only the second segment's reserved chunk, so validation points stay matched
