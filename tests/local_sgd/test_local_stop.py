import pytest
import torch

from lightning_hetero.local_sgd.local_stop import budgeted_plan
from lightning_hetero.local_sgd.rounds import LocalRounds, RoundBudget


def _round_trip(ranks, params) -> None:
    total = sum(rounds.message(flat) for rounds, flat in zip(ranks, params, strict=True))
    for rounds, flat in zip(ranks, params, strict=True):  # every rank applies the same sum
        rounds.apply(total.clone(), flat)


@pytest.mark.parametrize("max_steps", [1, 2, 7, 10, 23, 40])
@pytest.mark.parametrize("rates", [None, [300.0, 100.0]])
def test_the_rounds_end_on_max_steps_exactly_with_every_rank_on_the_same_parameters(max_steps, rates):
    ranks = [LocalRounds(RoundBudget(samples=8), rank, 2, local_steps="proportional") for rank in (0, 1)]
    params = [torch.zeros(1), torch.zeros(1)]
    for rank, rounds in enumerate(ranks):
        rounds.max_steps = max_steps
        if rates is not None:
            rounds.rates = list(rates)
            rounds.meter.update(100, 100 / rates[rank])
        rounds.begin(params[rank], batch_size=1)
    for _ in range(50):  # rounds: each rank takes its planned steps (none once max_steps is reached)
        if ranks[0].steps_total >= max_steps:
            break
        for rank, rounds in enumerate(ranks):
            assert rounds.round_s is None or max_steps - rounds.steps_total >= 2 * sum(rounds.plans[-1])
            for _ in range(rounds.target_steps):
                params[rank] += 1.0
                rounds.record_step(samples=1, step_s=0.01)
        _round_trip(ranks, params)
    assert [rounds.steps_total for rounds in ranks] == [max_steps, max_steps]
    assert params[0].item() == params[1].item()
    assert [rounds.target_steps for rounds in ranks] == [0, 0]  # nothing more to train


def test_a_slow_rank_may_have_no_share_of_the_last_round():
    assert budgeted_plan([12, 4], [300.0, 100.0], steps_left=3, proportional=True) == [3, 0]
    assert budgeted_plan([12, 4], [300.0, 100.0], steps_left=3, proportional=False) == [2, 1]
    assert budgeted_plan([12, 4], [300.0, 100.0], steps_left=31, proportional=True) == [12, 4]  # a round in steps
