import torch

from lightning_hetero.elastic.history import ID_SLOTS, from_slots, next_history, to_slots, winner
from lightning_hetero.elastic.rounds import ElasticRounds
from lightning_hetero.local_sgd.outer_optimizer import OuterOptimizer


def _join_round(group: list[ElasticRounds]) -> None:
    flats = [torch.zeros(2) for _ in group]
    for rounds, flat in zip(group, flats, strict=True):
        rounds.begin(flat)
    summed = sum(
        r.message(flat, None, rank, len(group)) for rank, (r, flat) in enumerate(zip(group, flats, strict=True))
    )
    for rank, (rounds, flat) in enumerate(zip(group, flats, strict=True)):
        assert not rounds.commit(summed.clone(), flat, None, rank, len(group)).diverged


def test_two_groups_of_fresh_workers_with_equal_rounds_carry_different_histories():
    """Without the workers' tags two pairs of fresh workers would commit identical join rounds (same participants,
    nothing trained, same hand-out) and carry the same id while holding the same chunks."""
    groups = [[ElasticRounds(8, 2, OuterOptimizer()) for _ in range(2)] for _ in range(2)]
    for group in groups:
        _join_round(group)
    assert [list(r.queue) for r in groups[0]] == [list(r.queue) for r in groups[1]]  # the same chunks, twice
    assert groups[0][0].history == groups[0][1].history != groups[1][0].history == groups[1][1].history


def test_ids_travel_exactly_in_any_float_dtype_and_a_tie_goes_to_the_smallest():
    for value in (0, 1, 255, 256, 2**24 - 1):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            slots = torch.tensor(to_slots(value), dtype=dtype) + torch.zeros(ID_SLOTS, dtype=dtype)
            assert from_slots(slots.tolist()) == value
    assert winner([9, 4, 9, 4]) == 4 and winner([9, 4, 9]) == 9
    assert next_history(torch.tensor([1.0, 2.0])) != next_history(torch.tensor([2.0, 1.0]))
