"""The adjustment period: when HeteroBatch adjusts (pure rules), the steps a period measured, and the exchange."""

import itertools
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lightning_hetero.hetero_batch.period import (
    EARLY_ADJUSTMENTS,
    EARLY_MIN_PERIOD,
    FIELDS,
    STEADY_PERIOD,
    SYNC_STEPS_KEPT,
    MeasuredPeriod,
    adjusts_after,
    describe,
    early_steps,
    gather_rows,
    own_row,
    read_rows,
    trimmed,
)
from lightning_hetero.measurement import BusyTimer


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


def test_warm_up_and_the_first_step_at_a_new_split_are_not_counted():
    period = MeasuredPeriod(skip=2)
    for busy in (1.0, 1.0, 0.03):
        period.record((32, 32), 1, busy, 0.0, busy)
    period.skip_next()
    period.record((40, 24), 1, 5.0, 0.0, 5.0)
    period.record((40, 24), 1, 0.025, 0.0, 0.026)
    steps, _, _ = period.close((40, 24), 1)
    assert steps == [(32, 0.03, 0.0), (24, 0.025, 0.0)]


def test_mean_busy_time_is_at_the_current_split_only_and_raised_to_the_quota_floor():
    period = MeasuredPeriod()
    period.record((32, 32), 0, 0.05, 0.0, 0.05)
    period.record((40, 24), 0, 0.02, 0.04, 0.05)
    period.record((40, 24), 0, 0.03, 0.04, 0.05)
    _, busy, walls = period.close((40, 24), 0)
    assert busy == 0.04 and walls == [0.05, 0.05]
    _, busy, walls = period.close((40, 24), 0)
    assert math.isnan(busy) and walls == []


def test_sync_walls_accumulate_while_the_split_stays_and_restart_when_it_changes():
    period = MeasuredPeriod()
    for _ in range(3):
        for _ in range(20):
            period.record((40, 24), 0, 0.03, 0.0, 0.031)
        period.close((40, 24), 0)
    assert len(period.sync_walls) == SYNC_STEPS_KEPT
    period.record((44, 20), 0, 0.03, 0.0, 0.029)
    period.close((44, 20), 0)
    assert period.sync_walls == [0.029]
    period.restart_sync((44, 20), [0.5])
    assert period.sync_walls == [0.5]


def _row(fit, latest, changed=False, position=0, busy=0.03, walls=(0.031,), newest=(0.031,), error=0.01):
    return own_row(fit, latest, changed, position, busy, list(walls), list(newest), error)


def test_a_row_has_every_field_in_order():
    row = _row((0.002, 0.001, 2), (0.004, 0.0015, 1), position=7, busy=0.05, walls=[0.04, 0.06], newest=[0.06])
    fields = dict(zip(FIELDS, row.tolist(), strict=True))
    assert fields["overhead_s"] == 0.002 and fields["per_sample_s"] == 0.001 and fields["known_sizes"] == 2
    assert fields["latest_overhead_s"] == 0.004 and fields["latest_known_sizes"] == 1
    assert fields["sync_step_s"] == pytest.approx(0.05) and fields["sync_steps"] == 2
    assert fields["newest_sync_step_s"] == pytest.approx(0.06) and fields["newest_sync_steps"] == 1
    assert fields["position"] == 7 and fields["busy_s"] == 0.05 and fields["changed"] == 0
    assert fields["relative_error"] == 0.01


def test_a_change_seen_by_one_rank_restarts_every_rank_from_its_newest_period():
    steady = _row((0.002, 0.001, 3), (0.005, 0.002, 1), walls=[0.03] * 8, newest=[0.09])
    changed = _row((0.010, 0.004, 1), (0.010, 0.004, 1), changed=True, walls=[0.09], newest=[0.09])
    seen = read_rows(torch.stack([steady, changed]))
    # the steady rank's fit is replaced by its newest-period fit; the changed rank keeps its (already restarted) one
    assert seen.costs == ((0.005, 0.002), (0.010, 0.004))
    assert seen.known_sizes == [1, 1]
    assert seen.sync_step_s == pytest.approx(0.09) and seen.sync_steps == 1
    assert seen.changed == (False, True)


def test_no_costs_while_a_rank_has_no_fit_and_no_sync_step_unless_every_rank_measured_it():
    fitted = _row((0.002, 0.001, 2), (0.002, 0.001, 2))
    unfitted = _row((0.0, None, 0), (0.0, None, 0), walls=[], newest=[])
    seen = read_rows(torch.stack([fitted, unfitted]))
    assert seen.costs is None and seen.sync_step_s is None and math.isnan(seen.busy_s[1]) is False


def test_reading_leaves_the_gathered_rows_unchanged():
    rows = torch.stack([_row((1.0, 1.0, 1), (2.0, 2.0, 1)), _row((1.0, 1.0, 1), (2.0, 2.0, 1), changed=True)])
    before = rows.clone()
    read_rows(rows)
    torch.testing.assert_close(rows, before, rtol=0, atol=0, equal_nan=True)  # no memory caps: NaN columns


def test_trimmed_drops_only_the_longest_step():
    assert trimmed([0.3, 0.1, 0.2]) == [0.1, 0.2]
    assert trimmed([0.5]) == [0.5] and trimmed([]) == []


def test_gather_rows_without_a_process_group_uses_the_strategy():
    class Strategy:
        def all_gather(self, tensor):
            return torch.stack([tensor, tensor + 1])

    rows = gather_rows(Strategy(), torch.zeros(len(FIELDS)), BusyTimer())
    assert rows.shape == (2, len(FIELDS)) and rows[1, 0] == 1


def test_memory_caps_travel_in_the_rows():
    rows = torch.stack(
        [
            _row((1.0, 1.0, 1), (1.0, 1.0, 1)),
            own_row((1.0, 1.0, 1), (1.0, 1.0, 1), False, 3, 0.03, [0.03], [0.03], 0.01, memory_cap=24),
        ]
    )
    caps = read_rows(rows).memory_caps
    assert math.isnan(caps[0]) and caps[1] == 24
