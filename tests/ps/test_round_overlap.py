import random

import pytest
import torch

from lightning_hetero.ps.local_sgd import LocalRounds, RoundBudget
from lightning_hetero.ps.outer_optimizer import OuterOptimizer
from lightning_hetero.ps.round_overlap import RoundOverlap


class SimulatedAllReduce:
    """The ranks' SUM all-reduces in one process: the n-th message of every rank is summed once all ranks sent their
    n-th, in place, and its handles complete then (as gloo's asynchronous all-reduce)."""

    class Handle:
        def __init__(self) -> None:
            self.done = False

        def is_completed(self) -> bool:
            return self.done

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.sent: list[list[tuple[torch.Tensor, SimulatedAllReduce.Handle]]] = [[] for _ in range(world_size)]
        self.completed = 0

    def start(self, rank: int, message: torch.Tensor) -> "SimulatedAllReduce.Handle":
        handle = self.Handle()
        self.sent[rank].append((message, handle))
        while all(len(sent) > self.completed for sent in self.sent):
            parts = [sent[self.completed] for sent in self.sent]
            total = sum(message.clone() for message, _ in parts)
            for message, handle_ in parts:
                message.copy_(total)
                handle_.done = True
            self.completed += 1
        return handle


def wait(handle) -> None:
    assert handle.is_completed(), "the simulation never blocks: every rank sent this all-reduce's message"


def test_a_second_launch_before_settling_is_refused():
    overlap = RoundOverlap(start=lambda message: SimulatedAllReduce.Handle(), wait=wait)
    assert overlap.settle(lambda summed, sent: "applied") is None  # nothing in flight
    overlap.launch(torch.zeros(3), torch.zeros(2))
    with pytest.raises(RuntimeError, match="settle it first"):
        overlap.launch(torch.zeros(3), torch.zeros(2))


@pytest.mark.parametrize("seed", range(5))
def test_overlapped_rounds_count_every_step_once_and_end_the_epoch_identical(seed):
    """Two ranks take random local steps (known increments) through overlapped round ends settled at random later
    steps, then end the epoch with blocking round ends: both end on the same parameters, equal (outer SGD lr 1, a plain
    mean over the ranks) to the start plus the mean of the ranks' summed increments: no step lost or counted twice."""
    rng = random.Random(seed)
    world, numel = 2, 4
    ranks = [
        LocalRounds(RoundBudget(samples=8), r, world, OuterOptimizer(torch.optim.SGD, {"lr": 1.0})) for r in (0, 1)
    ]
    reduce = SimulatedAllReduce(world)
    overlaps = [RoundOverlap(start=lambda m, r=r: reduce.start(r, m), wait=wait) for r in range(world)]
    params = [torch.zeros(numel, dtype=torch.float64) for _ in range(world)]
    totals = [torch.zeros(numel, dtype=torch.float64) for _ in range(world)]
    for rounds, flat in zip(ranks, params, strict=True):
        rounds.begin(flat, batch_size=1)

    def settle(r):
        overlaps[r].settle(lambda summed, sent: ranks[r].apply(summed, params[r], sent=sent))

    round_ends, at_round_end, steps = [0, 0], [False, False], 0
    while min(round_ends) < 6:
        r = rng.randrange(world)  # ranks at random speeds
        if round_ends[r] == 6:
            continue
        if at_round_end[r]:  # settle the round end in flight, then send this one
            if overlaps[r].pending is not None and not overlaps[r].ready():
                continue  # blocked until the other rank sends its message
            settle(r)
            overlaps[r].launch(ranks[r].message(params[r]), params[r])
            ranks[r].start_next_round()
            at_round_end[r], round_ends[r] = False, round_ends[r] + 1
            continue
        if overlaps[r].ready() and rng.random() < 0.5:
            settle(r)  # seen at a step's start
        step = torch.tensor([rng.uniform(-1, 1) for _ in range(numel)], dtype=torch.float64)
        params[r] += step
        totals[r] += step
        steps += 1
        at_round_end[r] = ranks[r].record_step(samples=1, step_s=None)
    for r in range(world):  # the epoch's end: settled, then a blocking round end
        settle(r)
    messages = [rounds.message(flat, done=True) for rounds, flat in zip(ranks, params, strict=True)]
    total = messages[0] + messages[1]
    outcomes = [rounds.apply(total.clone(), flat) for rounds, flat in zip(ranks, params, strict=True)]
    assert all(outcome.all_done for outcome in outcomes)
    expected = (totals[0] + totals[1]) / 2
    torch.testing.assert_close(params[0], params[1], rtol=0, atol=0)
    torch.testing.assert_close(params[0], expected)
    assert ranks[0].steps_total == ranks[1].steps_total == steps
