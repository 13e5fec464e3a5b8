import pytest

from lightning_hetero.measurement import ComputeTimer, ThroughputMeter


def test_meter_discards_warmup_and_smooths():
    meter = ThroughputMeter(smoothing=0.5, warmup_steps=2)
    assert meter.update(100, 10.0) is None
    assert meter.update(100, 10.0) is None
    assert meter.update(100, 1.0) == 100.0
    assert meter.update(100, 0.5) == 150.0
    assert meter.count == 2


def test_meter_ignores_invalid_measurements_and_restarts_warmup():
    meter = ThroughputMeter(smoothing=1.0, warmup_steps=0)
    meter.update(10, 1.0)
    assert meter.update(10, 0.0) == 10.0
    assert meter.update(0, 1.0) == 10.0
    meter.restart_warmup(1)
    assert meter.update(10, 0.1) == 10.0
    assert meter.update(10, 0.1) == pytest.approx(100.0)


def test_meter_state_round_trip_and_validation():
    meter = ThroughputMeter(warmup_steps=0)
    meter.update(8, 2.0)
    other = ThroughputMeter()
    other.load_state_dict(meter.state_dict())
    assert other.value == meter.value == 4.0
    with pytest.raises(ValueError, match="smoothing"):
        ThroughputMeter(smoothing=0.0)
    with pytest.raises(ValueError, match="warmup_steps"):
        ThroughputMeter(warmup_steps=-1)


def test_timer_uses_the_last_end_mark_and_needs_a_start():
    ticks = iter([1.0, 2.0, 3.5])
    timer = ComputeTimer(clock=lambda: next(ticks))
    timer.mark_compute_end()  # not started: ignored, no clock read
    assert timer.elapsed_s() is None
    timer.start()
    assert timer.running
    timer.mark_compute_end()
    timer.mark_compute_end()
    assert timer.elapsed_s() == 2.5
