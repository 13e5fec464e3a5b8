"""When HeteroBatch adjusts inside an epoch (pure rules)."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_hetero.hetero_batch.cadence import (
    EARLY_ADJUSTMENTS,
    EARLY_MIN_PERIOD,
    STEADY_PERIOD,
    adjusts_after,
    describe,
    early_steps,
)


@given(steps=st.integers(0, 400), warmup=st.integers(0, 20))
def test_each_early_split_is_measured_before_the_next_adjustment(steps, warmup):
    early = early_steps(steps, warmup)
    assert len(early) <= EARLY_ADJUSTMENTS
    marks = [warmup, *early, steps]  # the warm-up's end, the early adjustments, the epoch's end
    if early:
        gaps = [b - a for a, b in itertools.pairwise(marks)]
        assert min(gaps) >= EARLY_MIN_PERIOD, (marks, gaps)
        assert early[0] - warmup <= 8, "the first early adjustment comes within 8 measured steps"
    elif steps - warmup >= 2 * EARLY_MIN_PERIOD:
        pytest.fail(f"an epoch of {steps} steps after {warmup} of warm-up has room for an early adjustment")


@pytest.mark.parametrize(
    ("steps", "warmup", "expected"),
    [(16, 3, (9,)), (16, 2, (9,)), (12, 3, (7,)), (10, 3, ()), (100, 3, (11, 19)), (24, 0, (8, 16))],
)
def test_early_steps(steps, warmup, expected):
    assert early_steps(steps, warmup) == expected


def test_a_set_period_replaces_the_early_adjustments_in_every_epoch():
    for first_epoch in (True, False):
        chosen = [s for s in range(1, 17) if adjusts_after(s, 16, every=5, warmup_steps=3, first_epoch=first_epoch)]
        assert chosen == [5, 10, 15]


def test_later_epochs_adjust_every_steady_period_and_short_ones_at_their_end_only():
    later = [s for s in range(1, 101) if adjusts_after(s, 100, every=None, warmup_steps=3, first_epoch=False)]
    assert later == list(range(STEADY_PERIOD, 100, STEADY_PERIOD))
    assert not any(adjusts_after(s, 32, every=None, warmup_steps=3, first_epoch=False) for s in range(1, 33))
    assert not adjusts_after(16, 16, every=None, warmup_steps=0, first_epoch=True)  # the epoch's end adjusts anyway
    assert not adjusts_after(16, 16, every=4, warmup_steps=0, first_epoch=True)


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="warmup_steps"):
        early_steps(16, warmup_steps=-1)


@given(steps=st.integers(0, 400), warmup=st.integers(0, 20), first_epoch=st.booleans())
def test_the_printed_cadence_names_the_steps_the_rules_adjust_at(steps, warmup, first_epoch):
    line = describe(steps, None, warmup, first_epoch, lock_step=True)
    inside = [s for s in range(1, steps + 1) if adjusts_after(s, steps, None, warmup, first_epoch)]
    early = early_steps(steps, warmup) if first_epoch else ()
    assert set(early) <= set(inside)
    steady = [s for s in inside if s not in early]
    assert all(s % STEADY_PERIOD == 0 for s in steady), "the rules adjust at the named steps and every 32 only"
    assert line.startswith("at every epoch's end")
    if early:
        named = " and ".join(map(str, early))
        assert f"step{'s' if len(early) > 1 else ''} {named} of this first epoch" in line
    else:
        assert "first epoch" not in line
    assert (f"every {STEADY_PERIOD} steps inside epochs of {steps} steps" in line) == (steps > STEADY_PERIOD)


def test_a_set_period_or_a_strategy_out_of_lock_step_is_printed_as_such():
    assert describe(64, 8, 2, True, lock_step=True).endswith("every 8 steps inside it (adjust_every_n_steps=8)")
    assert "do not step together" in describe(64, None, 2, True, lock_step=False)
