import math

import pytest

from lightning_hetero.local_sgd.round_plan import RoundBudget, plan_local_steps

# ---------------------------------------------------------------- RoundBudget


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "exactly one of round_samples and round_s"),
        ({"samples": 64, "seconds": 1.0}, "exactly one of round_samples and round_s"),
        ({"samples": 0}, "round_samples must be an integer >= 1, got 0"),
        ({"samples": -5}, "round_samples must be an integer >= 1"),
        ({"samples": 2.5}, "round_samples must be an integer >= 1"),
        ({"samples": True}, "round_samples must be an integer >= 1"),
        ({"seconds": 0.0}, "round_s must be > 0"),
        ({"seconds": -1.0}, "round_s must be > 0"),
        ({"seconds": math.nan}, "round_s"),
        ({"seconds": math.inf}, "round_s"),
    ],
)
def test_bad_budget_fails_naming_the_setting(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RoundBudget(**kwargs)


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
