import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_hetero.switching.policies import (
    EpochContext,
    FixedFractionPolicy,
    GreedyPolicy,
    Phase,
    SchedulePolicy,
    SwitchPolicy,
    parse_schedule,
    plan,
    share_in_epochs,
)


def test_fixed_fraction_rounds_up_to_whole_epochs():
    assert plan(FixedFractionPolicy(0.05), max_epochs=10) == ["bsp"] + ["asp"] * 9
    assert plan(FixedFractionPolicy(0.07), max_epochs=100).count("bsp") == 7
    assert plan(FixedFractionPolicy(0.0), max_epochs=3) == ["asp"] * 3
    assert plan(FixedFractionPolicy(1.0), max_epochs=3) == ["bsp"] * 3


def test_fixed_fraction_asp_first_puts_bsp_at_the_end():
    assert plan(FixedFractionPolicy(0.5, first="asp"), max_epochs=4) == ["asp", "asp", "bsp", "bsp"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"bsp_fraction": 1.5}, "bsp_fraction"), ({"bsp_fraction": -0.1}, "bsp_fraction"), ({"first": "ssp"}, "first")],
)
def test_fixed_fraction_rejects_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FixedFractionPolicy(**kwargs)


def test_fixed_fraction_needs_max_epochs():
    with pytest.raises(ValueError, match="max_epochs"):
        FixedFractionPolicy().check_max_epochs(None)


@given(fraction=st.floats(0, 1), max_epochs=st.integers(1, 200))
def test_fixed_fraction_is_one_bsp_block_then_asp(fraction, max_epochs):
    modes = plan(FixedFractionPolicy(fraction), max_epochs)
    bsp = share_in_epochs(fraction, max_epochs)
    assert modes == ["bsp"] * bsp + ["asp"] * (max_epochs - bsp)
    assert bsp >= fraction * max_epochs - 1e-6
    assert bsp < fraction * max_epochs + 1


def test_parse_schedule_any_order_and_forms():
    assert parse_schedule("asp:5-,bsp:0-4") == (Phase("bsp", 0, 4), Phase("asp", 5, None))
    assert parse_schedule(" BSP:0 , asp:1-2 ") == (Phase("bsp", 0, 0), Phase("asp", 1, 2))


@pytest.mark.parametrize(
    ("schedule", "match"),
    [
        ("", "empty"),
        ("  ", "empty"),
        ("bsp:0-4,asp:3-", "overlap at epoch 3"),
        ("bsp:0-4,bsp:2-3,asp:5-", "overlap"),
        ("bsp:0-4,ssp:5-", "unknown mode 'ssp'"),
        ("bsp:1-4,asp:5-", "no mode for epochs 0-0"),
        ("bsp:0-2,asp:5-", "no mode for epochs 3-4"),
        ("bsp:0-,asp:5-", "runs to the end of training"),
        ("bsp:4-2", "ends before it starts"),
        ("bsp0-4", "cannot parse"),
        ("bsp:0-4,", "cannot parse"),
    ],
)
def test_bad_schedules_raise_at_construction(schedule, match):
    with pytest.raises(ValueError, match=match):
        SchedulePolicy(schedule)


def test_schedule_yields_the_planned_modes_in_any_order():
    assert plan(SchedulePolicy("asp:0-1,bsp:2-3,asp:4-"), 6) == ["asp", "asp", "bsp", "bsp", "asp", "asp"]
    assert plan(SchedulePolicy("asp:3-,bsp:0-2"), 5) == ["bsp"] * 3 + ["asp"] * 2


def test_finite_schedule_must_cover_the_run():
    policy = SchedulePolicy("bsp:0-4,asp:5-7")
    policy.check_max_epochs(8)
    with pytest.raises(ValueError, match="covers epochs 0-7 only"):
        policy.check_max_epochs(9)
    with pytest.raises(ValueError, match="unbounded"):
        policy.check_max_epochs(None)
    SchedulePolicy("bsp:0-4,asp:5-").check_max_epochs(None)


def test_greedy_switches_to_asp_while_a_straggler_lasts_and_spends_the_budget():
    stragglers = [False, False, True, True, False, False, False, False, False, False]
    modes = plan(GreedyPolicy(bsp_fraction=0.4), 10, stragglers)
    assert modes == ["bsp", "bsp", "asp", "asp", "bsp", "bsp", "asp", "asp", "asp", "asp"]
    assert modes.count("bsp") == 4


def test_greedy_full_budget_needs_no_max_epochs():
    policy = GreedyPolicy()
    policy.check_max_epochs(None)
    assert policy.mode_for_epoch(EpochContext(3, None, ("bsp",) * 3, straggler=True)) == "asp"
    assert policy.mode_for_epoch(EpochContext(4, None, ("bsp",) * 3 + ("asp",), straggler=False)) == "bsp"
    with pytest.raises(ValueError, match="max_epochs"):
        GreedyPolicy(0.5).check_max_epochs(None)
    with pytest.raises(ValueError, match="bsp_fraction"):
        GreedyPolicy(2.0)


@given(stragglers=st.lists(st.booleans(), min_size=1, max_size=40), fraction=st.floats(0, 1))
def test_greedy_never_trains_bsp_during_a_straggler_nor_beyond_its_budget(stragglers, fraction):
    modes = plan(GreedyPolicy(fraction), len(stragglers), stragglers)
    budget = share_in_epochs(fraction, len(stragglers)) if fraction < 1 else len(stragglers)
    assert modes.count("bsp") <= budget
    assert all(mode == "asp" for mode, straggler in zip(modes, stragglers, strict=True) if straggler)


def test_user_policy_only_needs_mode_for_epoch():
    class EveryThird(SwitchPolicy):
        def mode_for_epoch(self, context):
            return "bsp" if context.epoch % 3 == 0 else "asp"

    assert plan(EveryThird(), 4) == ["bsp", "asp", "asp", "bsp"]


def test_fixed_fraction_policy_alternates_bsp_and_asp_only():
    with pytest.raises(ValueError, match="first must be 'bsp' or 'asp', got 'local'"):
        FixedFractionPolicy(first="local")


def test_schedules_accept_the_local_sgd_mode():
    assert plan(SchedulePolicy("bsp:0-1,local:2-"), max_epochs=4) == ["bsp", "bsp", "local", "local"]
