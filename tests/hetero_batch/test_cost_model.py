import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lightning_hetero.hetero_batch.cost_model import PeriodCostModel


def test_fits_overhead_and_per_sample_cost_from_two_sizes():
    model = PeriodCostModel()
    model.update([(40, 0.005 + 0.001 * 40)] * 8)
    model.update([(20, 0.005 + 0.001 * 20)] * 8)
    assert model.overhead_s == pytest.approx(0.005)
    assert model.per_sample_s == pytest.approx(0.001)
    assert model.step_time_s(30) == pytest.approx(0.035)


def test_a_period_is_reduced_to_the_mean_of_each_size_not_the_median():
    """A throttle that hits one step in four is a real cost: the mean keeps it, a median would not."""
    model = PeriodCostModel()
    model.update([(16, 0.010), (16, 0.010), (16, 0.010), (16, 0.070)] * 2)
    assert model.step_time_s(16) == pytest.approx(0.025)


def test_means_are_merged_over_periods_at_the_same_size():
    model = PeriodCostModel(memory_steps=16)
    model.update([(32, 0.010)] * 8)
    model.update([(32, 0.012)] * 8)  # within the tolerance: merged, not replaced
    assert model.sizes[32] == (pytest.approx(0.011), 16)
    model.update([(32, 0.014)] * 8)  # the cap keeps the newest 16 steps' weight
    assert model.sizes[32] == (pytest.approx(0.0125), 16)


def test_a_speed_change_forgets_older_sizes_and_keeps_the_overhead_share():
    model = PeriodCostModel()
    model.update([(40, 0.045)] * 8)
    model.update([(20, 0.025)] * 8)
    assert model.overhead_s == pytest.approx(0.005)
    report = model.update([(20, 0.100)] * 8)  # 4x slower
    assert report.changed and report.prediction_error == pytest.approx(3.0)
    assert list(model.sizes) == [20]
    assert model.step_time_s(20) == pytest.approx(0.100)
    assert model.overhead_s / model.step_time_s(20) == pytest.approx(0.2)  # share kept: 5 of 25 ms
    faster = model.update([(20, 0.050)] * 8)  # twice as fast: a factor of 2 is past the default tolerance (1.4x)
    assert faster.changed


@pytest.mark.parametrize("noise", [1.3, 1 / 1.3])
def test_noise_within_the_tolerance_keeps_the_history(noise):
    model = PeriodCostModel(change_tolerance=0.4)
    model.update([(40, 0.045)] * 8)
    model.update([(20, 0.025)] * 8)
    assert not model.update([(40, 0.045 * noise)] * 8).changed
    assert set(model.sizes) == {20, 40}


def test_close_sizes_do_not_fit_an_intercept():
    """Sizes within min_spread of each other give an ill-conditioned line: the overhead share is kept instead."""
    model = PeriodCostModel(min_spread=0.1)
    model.update([(50, 0.030)] * 8)
    model.update([(51, 0.0400)] * 8)  # would fit 10 ms per sample and a hugely negative intercept
    assert model.overhead_s == 0.0
    assert model.per_sample_s == pytest.approx(model.sizes[51][0] / 51)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(1, 128), st.floats(1e-4, 1.0)), min_size=1, max_size=12),
        min_size=1,
        max_size=8,
    )
)
@example([[(1, 1.0), (1, 0.375), (1, 0.0625), (4, 0.5)], [(11, 1.0), (10, 0.5)]])  # rescaled share over the ceiling
def test_the_fit_stays_physically_plausible(periods):
    """Whatever the measurements, 0 <= overhead <= 0.9 x the smallest size's measured mean and the slope is positive,
    so no rank can be predicted to need more time than measured at its smallest size just for showing up."""
    model = PeriodCostModel()
    for steps in periods:
        model.update(steps)
        assert model.per_sample_s is not None and model.per_sample_s > 0
        assert model.overhead_s >= 0.0
        smallest = min(model.sizes)
        assert model.overhead_s <= 0.9 * model.sizes[smallest][0] + 1e-12 or len(model.sizes) == 1
        assert all(math.isfinite(model.step_time_s(b)) for b in (1, 64))


def test_state_round_trip_and_validation():
    model = PeriodCostModel()
    model.update([(40, 0.045)] * 8)
    model.update([(20, 0.025)] * 8)
    other = PeriodCostModel()
    other.load_state_dict(model.state_dict())
    assert other.step_time_s(30) == pytest.approx(model.step_time_s(30))
    assert other.sizes == model.sizes and other.variances == model.variances
    for kwargs, message in [
        ({"change_tolerance": 0.0}, "change_tolerance"),
        ({"min_spread": float("nan")}, "min_spread"),
        ({"max_overhead_share": 1.0}, "max_overhead_share"),
        ({"max_sizes": 0}, "max_sizes"),
        ({"memory_steps": 0}, "memory_steps"),
    ]:
        with pytest.raises(ValueError, match=message):
            PeriodCostModel(**kwargs)


def test_a_move_from_one_known_size_that_a_plausible_overhead_explains_is_not_a_speed_change():
    """A container at 0.25 CPU with 40 ms of fixed cost per step and 0.27 ms per sample: measured at 256 samples
    only, the overhead is unknown, so 64 ms at 90 samples (the proportional guess says 38 ms) is information about
    the overhead, which two sizes then pin down; the same rank 4x slower at a known size is still a change."""
    model = PeriodCostModel()

    def cost(b):
        return 0.040 + 0.00027 * b

    model.update([(256, cost(256))] * 3)
    report = model.update([(90, cost(90))] * 3)
    assert not report.changed and report.prediction_error > 0.4  # a 68% miss, within the plausible band
    assert model.identified
    assert model.overhead_s == pytest.approx(0.040) and model.per_sample_s == pytest.approx(0.00027)
    assert model.update([(90, 4 * cost(90))] * 3).changed


def test_right_after_a_change_a_miss_at_a_new_size_is_a_change_again():
    """bench_controller's flip (sleep HL4, 2 ranks): the period that saw the change mixed 2 slow steps with 5 fast
    ones. Had the next size been checked against the band of plausible overheads, the mixed level and the new
    size would have made a line with an 11 ms overhead (truth 1 ms) and sent the split to [1, 63] before it came
    back to [11, 53]; a miss there restarts the model from the newest period instead."""
    model = PeriodCostModel()
    model.update([(8, 0.036)] * 7)
    model.update([(16, 0.068)] * 7)  # 4 ms + 4 ms/sample, identified
    assert model.update([(8, 0.036)] * 2 + [(8, 0.009)] * 5).changed  # 4x faster from the third step on
    report = model.update([(37, 0.038)] * 6)  # 1 ms + 1 ms/sample
    assert report.changed and len(model.sizes) == 1
    assert model.update([(30, 0.031)] * 6).changed is False  # then the band applies again: a second size ...
    assert model.identified and model.overhead_s == pytest.approx(0.001, abs=1e-4)  # ... pins the overhead


def test_relative_error_is_the_standard_error_of_a_size_level_over_its_merged_periods():
    model = PeriodCostModel()
    model.update([(32, 0.008), (32, 0.012)] * 4)  # one step: 2 ms either side of 10 ms, 8 steps
    assert model.relative_error(32) == pytest.approx(0.002 / math.sqrt(8) / 0.010)
    model.update([(32, 0.010)] * 8)  # steady steps halve the pooled variance over twice the steps
    assert model.relative_error(32) == pytest.approx(math.sqrt(0.002**2 / 2 / 16) / 0.010)
    assert math.isnan(model.relative_error(16))
    # a change of speed forgets the older periods' spread with their sizes
    model.update([(32, 0.040)] * 8)
    assert model.relative_error(32) == 0.0
    # restarting from the newest period takes its spread
    model.update([(32, 0.038), (32, 0.042)] * 4)
    model.restart_from_latest()
    assert model.relative_error(32) == pytest.approx(0.002 / math.sqrt(8) / 0.040)


def test_relative_error_under_a_quota_is_that_of_the_level_the_floor_sets():
    # a quarter-CPU rank that does not limit the step: 9 ms of CPU (floor 36 ms) each step, throttled inside its
    # window one step in four; its level is the mean floor, whose spread is its CPU time's
    model = PeriodCostModel()
    steps = [(5, 0.009, 0.036), (5, 0.009, 0.036), (5, 0.009, 0.037), (5, 0.075, 0.035)] * 2
    model.update(steps)
    assert model.step_time_s(5) == pytest.approx(0.036)
    floors = [0.036, 0.036, 0.037, 0.035]
    mean = sum(floors) / 4
    spread = math.sqrt(sum((f - mean) ** 2 for f in floors) / 4)
    assert model.relative_error(5) == pytest.approx(spread / math.sqrt(8) / 0.036)
    # where the busy time sets the level (the rank limits the step), its spread counts
    limiting = PeriodCostModel()
    limiting.update([(5, 0.020, 0.010), (5, 0.060, 0.010)] * 4)
    assert limiting.relative_error(5) == pytest.approx(0.020 / math.sqrt(8) / 0.040)
