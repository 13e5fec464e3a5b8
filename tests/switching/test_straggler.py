import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_hetero.switching.straggler import StragglerDetector


def feed(detector, values):
    return [detector.update(v) for v in values]


def test_needs_k_consecutive_slow_measurements():
    detector = StragglerDetector(threshold=0.5, k=3, baseline_measurements=2)
    verdicts = feed(detector, [10, 10, 4, 4, 9, 4, 4, 4])
    assert verdicts == [False] * 7 + [True]


def test_recovers_after_k_consecutive_healthy_measurements():
    detector = StragglerDetector(threshold=0.5, k=2, baseline_measurements=1)
    feed(detector, [10, 2, 2])
    assert detector.straggling
    assert feed(detector, [9, 2, 9, 9]) == [True, True, True, False]


def test_baseline_is_the_mean_of_the_first_measurements_and_is_kept():
    detector = StragglerDetector(threshold=0.7, k=1, baseline_measurements=3)
    feed(detector, [8, 10, 12])
    assert detector.baseline == 10
    feed(detector, [7.5, 7.5])
    assert not detector.straggling and detector.baseline == 10
    assert detector.update(6.9)


def test_a_slow_but_steady_rank_is_not_a_straggler():
    detector = StragglerDetector(threshold=0.7, k=2, baseline_measurements=2)
    assert not any(feed(detector, [1.0] * 50))


def test_ignores_bad_measurements_and_resets():
    detector = StragglerDetector(threshold=0.5, k=1, baseline_measurements=1)
    feed(detector, [float("nan"), 0.0, -1.0, 10.0, float("inf"), 1.0])
    assert detector.baseline == 10 and detector.straggling
    detector.reset()
    assert detector.baseline is None and not detector.straggling


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"threshold": 0}, "threshold"),
        ({"threshold": 1}, "threshold"),
        ({"k": 0}, "k"),
        ({"baseline_measurements": 0}, "baseline_measurements"),
    ],
)
def test_rejects_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StragglerDetector(**kwargs)


@given(values=st.lists(st.floats(0.1, 100), max_size=60), split=st.integers(0, 60))
def test_state_round_trip_continues_identically(values, split):
    split = min(split, len(values))
    reference = StragglerDetector(threshold=0.6, k=2, baseline_measurements=3)
    expected = feed(reference, values)
    first = StragglerDetector(threshold=0.6, k=2, baseline_measurements=3)
    head = feed(first, values[:split])
    second = StragglerDetector(threshold=0.6, k=2, baseline_measurements=3)
    second.load_state_dict(first.state_dict())
    assert head + feed(second, values[split:]) == expected
