import pytest

from lightning_hetero.measurement import (
    BusyTimer,
    ComputeTimer,
    ThroughputMeter,
    cgroup_cpu_quota,
    sustained_step_s,
)


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


def test_busy_timer_subtracts_waits_between_step_starts():
    ticks = iter([0.0, 0.010, 0.030, 0.050, 0.080, 0.100, 0.150])
    timer = BusyTimer(clock=lambda: next(ticks), cpu_clock=lambda: 0.0)
    assert timer.step_start() is None  # 0.000
    timer.mark_ready()  # 0.010: gradients handed to the all-reduce
    timer.close_ready()  # 0.030: the all-reduce returned: 20 ms waiting
    with timer.waiting():  # 0.050 .. 0.080: a sync_dist log
        pass
    assert timer.step_start() == pytest.approx(0.100 - 0.020 - 0.030)
    assert timer.last_wall_s == pytest.approx(0.100)
    timer.skip()  # e.g. an epoch boundary: the open step is not measured
    assert timer.step_start() is None


def test_busy_timer_ignores_a_wait_with_no_ready_mark_and_records_cpu():
    cpu = iter([1.0, 1.25])
    timer = BusyTimer(clock=iter([0.0, 0.5]).__next__, cpu_clock=lambda: next(cpu))
    timer.step_start()
    timer.close_ready()  # nothing was marked: no clock read, no wait
    assert timer.step_start() == 0.5
    assert timer.last_cpu_s == 0.25


def test_busy_timer_without_a_cpu_clock_reads_no_cpu_time():
    timer = BusyTimer(clock=iter([0.0, 0.5]).__next__, cpu_clock=None)
    timer.step_start()
    assert timer.step_start() == 0.5 and timer.last_cpu_s is None


def test_sustained_step_is_cpu_time_at_the_quota_rate_when_longer():
    assert sustained_step_s(0.010, cpu_s=0.009, quota_cpus=0.25) == pytest.approx(0.036)
    assert sustained_step_s(0.050, cpu_s=0.009, quota_cpus=0.25) == 0.050
    assert sustained_step_s(0.010, cpu_s=None, quota_cpus=0.25) == 0.010
    assert sustained_step_s(0.010, cpu_s=0.009, quota_cpus=None) == 0.010


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"cpu.max": "50000 100000\n"}, 0.5),
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "25000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 0.25),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_cgroup_cpu_quota_reads_v2_and_v1(tmp_path, files, expected):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_quota(tmp_path) == expected
