import math

import pytest

from lightning_hetero.local_sgd.round_plan import RoundBudget, parse_round_length, plan_local_steps

# ---------------------------------------------------------------- RoundBudget


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "exactly one of steps, seconds and samples"),
        ({"samples": 64, "seconds": 1.0}, "exactly one of steps, seconds and samples"),
        ({"steps": 4, "samples": 64}, "exactly one of steps, seconds and samples"),
        ({"samples": 0}, "round_length must be an integer >= 1, got 0"),
        ({"samples": -5}, "round_length must be an integer >= 1"),
        ({"samples": 2.5}, "round_length must be an integer >= 1"),
        ({"samples": True}, "round_length must be an integer >= 1"),
        ({"steps": 0}, "round_length must be an integer >= 1, got 0"),
        ({"seconds": 0.0}, "round_length must be > 0"),
        ({"seconds": -1.0}, "round_length must be > 0"),
        ({"seconds": math.nan}, "round_length"),
        ({"seconds": math.inf}, "round_length"),
    ],
)
def test_bad_budget_fails_naming_the_setting(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RoundBudget(**kwargs)


@pytest.mark.parametrize(
    ("length", "budget"),
    [
        (16, RoundBudget(steps=16)),
        ("30s", RoundBudget(seconds=30.0)),
        ("2.5 s", RoundBudget(seconds=2.5)),
        ("2048 samples", RoundBudget(samples=2048)),
        (" 64samples ", RoundBudget(samples=64)),
    ],
)
def test_round_length_reads_steps_seconds_and_samples(length, budget):
    assert parse_round_length(length) == budget


@pytest.mark.parametrize(
    ("length", "match"),
    [
        ("30 min", "round_length must be local steps per rank"),
        ("-2 samples", "round_length must be local steps per rank"),
        ("16", "round_length must be local steps per rank"),
        ("0s", "round_length must be > 0"),
        ("2.5 samples", "round_length must be an integer >= 1, got 2.5"),
        (0, "round_length must be an integer >= 1, got 0"),
        (2.5, "round_length must be an integer >= 1"),
    ],
)
def test_a_bad_round_length_fails_naming_it(length, match):
    with pytest.raises(ValueError, match=match):
        parse_round_length(length)


def test_steps_become_samples_over_all_ranks_once_the_batch_is_known():
    assert RoundBudget(steps=16).in_samples(world_size=4, batch_size=8) == RoundBudget(samples=512)
    assert RoundBudget(seconds=2.0).in_samples(world_size=4, batch_size=8) == RoundBudget(seconds=2.0)


# ---------------------------------------------------------------- plan_local_steps


def test_proportional_steps_follow_the_rates_and_fill_the_budget():
    plan = plan_local_steps(RoundBudget(samples=64 * 32), 32, [400.0, 100.0, 100.0, 200.0])
    assert sum(plan) == 64
    assert plan == [32, 8, 8, 16]


def test_equal_steps_ignore_the_rates():
    assert plan_local_steps(RoundBudget(samples=64 * 32), 32, [400.0, 100.0, 100.0, 200.0], "equal") == [16] * 4


def test_every_rank_takes_at_least_one_step():
    plan = plan_local_steps(RoundBudget(samples=4 * 32), 32, [1000.0, 1.0, 1.0])
    assert min(plan) == 1 and sum(plan) == 4


def test_unknown_rates_give_equal_steps():
    assert plan_local_steps(RoundBudget(samples=640), 32, [300.0, None]) == [10, 10]
    assert plan_local_steps(RoundBudget(seconds=2.0), 32, [None, None]) == [1, 1]


def test_time_budget_gives_each_rank_the_steps_that_fill_it():
    assert plan_local_steps(RoundBudget(seconds=1.0), 10, [100.0, 25.0]) == [10, 2]  # ~1 s each


def test_unknown_local_steps_policy_is_refused():
    with pytest.raises(ValueError, match="local_steps must be one of"):
        plan_local_steps(RoundBudget(samples=8), 1, [1.0], "fast")
