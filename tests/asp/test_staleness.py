import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_hetero.asp.staleness import StalenessGate, StalenessTracker, staleness_lr_factor


def test_tracker_summary_per_worker():
    tracker = StalenessTracker()
    for worker, staleness in [(1, 0), (1, 3), (2, 1), (1, 0)]:
        tracker.record(worker, staleness)
    summary = tracker.summary()
    assert summary["updates"] == 4
    assert summary["staleness_mean"] == 1.0
    assert summary["staleness_max"] == 3
    assert summary["updates_per_worker"] == {1: 3, 2: 1}


def test_gate_disabled_never_blocks():
    gate = StalenessGate(None)
    for _ in range(10):
        gate.tick(0)
    gate.tick(1)
    assert gate.may_proceed(0) and gate.may_proceed(1)


def test_gate_rejects_negative_bound():
    with pytest.raises(ValueError, match="max_staleness"):
        StalenessGate(-1)


def test_rejoining_worker_starts_level_with_the_slowest():
    gate = StalenessGate(1)
    for _ in range(5):
        gate.tick(0)
    gate.finish(0)
    gate.tick(1)
    gate.tick(0)  # rejoins level with worker 1: its old lead does not carry over
    assert gate.clocks == {1: 1, 0: 2}
    assert gate.may_proceed(0)


@given(
    max_staleness=st.integers(0, 3),
    schedule=st.lists(st.integers(0, 2), min_size=1, max_size=60),
)
def test_gate_never_deadlocks_and_bounds_the_lead(max_staleness, schedule):
    """Workers that may proceed tick in the given order; a blocked pick goes to the slowest instead."""
    gate = StalenessGate(max_staleness)
    for worker in range(3):
        gate.tick(worker)
    for pick in schedule:
        if not gate.may_proceed(pick):
            clocks = gate.clocks
            pick = min(clocks, key=clocks.get)
            assert gate.may_proceed(pick)  # the slowest can always go on
        gate.tick(pick)
        clocks = gate.clocks
        assert max(clocks.values()) - min(clocks.values()) <= max_staleness + 1


def test_lr_factor_rules():
    assert staleness_lr_factor(3) == 1.0
    assert staleness_lr_factor(3, "inverse") == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="lr_scaling"):
        staleness_lr_factor(1, "sqrt")
