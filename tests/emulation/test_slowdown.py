import statistics
import time

import lightning as L
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_hetero.emulation.slowdown import CfsQuota, SlowdownEmulator, SlowdownSchedule, stretch_s
from lightning_hetero.measurement import ComputeTimer
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule
from tests.helpers import read_json


class WindowRecorder(L.Callback):
    """Single-process stand-in for HeteroBatchCallback's window (batch start to the end of backward).

    Beside each step's window it records how long the emulator slept in it, so that ``window - slept`` is the step's
    real compute, measured in the same step: a change in machine load between steps cancels out.
    """

    def __init__(self, emulator: SlowdownEmulator) -> None:
        self.emulator = emulator
        self.timer = ComputeTimer()
        self.steps: list[tuple[float, float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.timer.start()

    def on_after_backward(self, trainer, pl_module):
        self.timer.mark_compute_end()
        self.steps.append((self.timer.elapsed_s(), self.emulator.batch_stretch_s))


def _fit(callbacks, num_batches=4, batch_size=512):
    torch.manual_seed(0)
    trainer = L.Trainer(
        max_epochs=1,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    dm = SyntheticClassificationDataModule(
        num_samples=num_batches * batch_size, batch_size=batch_size, num_features=128
    )
    trainer.fit(MLPClassifier(num_features=128, hidden=2048), datamodule=dm)
    return trainer


@pytest.mark.timing
@pytest.mark.parametrize("factor", [2.0, 3.5])
def test_measured_slowdown_matches_factor(factor):
    torch.set_num_threads(1)
    emulator = SlowdownEmulator(factors={0: factor})
    recorder = WindowRecorder(emulator)
    _fit([recorder, emulator], num_batches=24)
    achieved = [window / (window - slept) for window, slept in recorder.steps[4:]]
    assert statistics.median(achieved) == pytest.approx(factor, rel=0.10), achieved


def test_unslowed_rank_does_not_sleep():
    emulator = SlowdownEmulator(schedule={0: {0: 1.0}, 2: {0: 2.0}}, unit="step")
    recorder = WindowRecorder(emulator)
    _fit([recorder, emulator], num_batches=4)
    assert [slept > 0 for _, slept in recorder.steps] == [False, False, True, True]


def test_schedule_by_epoch_and_default_factor():
    schedule = SlowdownSchedule(schedule={2: {0: 3.0}, 5: {1: 2.0}})
    assert [schedule.factor(0, epoch, step=0) for epoch in (0, 1, 2, 4, 5)] == [1.0, 1.0, 3.0, 3.0, 1.0]
    assert schedule.factor(1, epoch=7, step=0) == 2.0
    assert schedule.ranks == {0, 1}


def test_static_factors_ignore_position():
    schedule = SlowdownSchedule(factors={1: 1.5})
    assert schedule.factor(1, epoch=100, step=10_000) == 1.5


def test_stretch_is_proportional_to_compute():
    assert stretch_s(2.0, forward_s=0.01, backward_s=0.03) == pytest.approx(0.04)
    assert stretch_s(1.0, forward_s=0.01, backward_s=0.03) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of"),
        ({"factors": {0: 2.0}, "schedule": {0: {0: 2.0}}}, "exactly one of"),
        ({"factors": {0: 0.5}}, r"factors\[0\] \(a slowdown factor\) must be >= 1"),
        ({"factors": {-1: 2.0}}, "factors: a rank must be an integer >= 0"),
        ({"schedule": {3: {1: float("inf")}}}, r"schedule\[3\]\[1\]"),
        ({"schedule": {-2: {1: 2.0}}}, "schedule: a start must be an integer >= 0"),
        ({"factors": {0: 2.0}, "unit": "batch"}, "unit must be one of"),
        ({"factors": {0: 2.0}, "backward_window": 0}, "backward_window"),
        ({"factors": {0: 2.0}, "throttle": "cgroup"}, "throttle must be one of"),
        ({"factors": {0: 2.0}, "throttle": "cfs", "period_ms": 0}, "period_ms"),
    ],
)
def test_bad_configuration_fails_at_init(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SlowdownEmulator(**kwargs)


def test_rank_beyond_world_size_fails_at_setup():
    with pytest.raises(ValueError, match=r"ranks \[3\] named, but the world size is 1"):
        _fit([SlowdownEmulator(factors={3: 2.0})], num_batches=1)


@pytest.mark.timing
@pytest.mark.multiprocess
def test_ddp_slowdown_falls_inside_the_comm_hook_window(run_script, tmp_path):
    run_script("slowdown_ddp.py", str(tmp_path), "2.0")
    fast, slow = (read_json(tmp_path / f"rank{rank}.json")["steps"] for rank in range(2))
    assert all(slept == 0.0 for _, slept in fast)
    assert slow[0][1] == 0.0, "the first step (one-off costs) is not stretched"
    assert all(window > slept > 0 for window, slept in slow[1:])
    achieved = [window / (window - slept) for window, slept in slow[4:]]
    assert statistics.median(achieved) == pytest.approx(2.0, rel=0.10), achieved


def test_cfs_quota_throttles_to_the_period_end_and_carries_debt():
    quota = CfsQuota(quota_cpus=0.25, period_s=0.1)
    assert quota.charge(0.024, now_s=10.0) == 0.0
    assert quota.charge(0.002, now_s=10.05) == pytest.approx(0.05)  # 26 ms used: sleep to 10.1 s
    assert quota.remaining_s == pytest.approx(0.024)  # refilled to 25 ms, minus the 1 ms owed
    # blocked (no CPU) for three periods: the budget does not accumulate beyond one quota
    assert quota.charge(0.0, now_s=10.45) == 0.0
    assert quota.remaining_s == pytest.approx(0.025)
    # a chunk of 100 ms of CPU owes 75 ms: three refills, waking at the start of the fourth period after 10.4 s
    assert quota.charge(0.100, now_s=10.48) == pytest.approx(0.32)
    assert quota.remaining_s == pytest.approx(0.025)  # -75 ms + 4 refills of 25 ms, capped at one quota


def test_cfs_quota_of_a_full_cpu_or_more_never_throttles_a_busy_thread():
    quota = CfsQuota(quota_cpus=1.0, period_s=0.1)
    now = 0.0
    for _ in range(100):
        now += 0.013
        assert quota.charge(0.013 * 0.999, now_s=now) == 0.0


@settings(max_examples=200, deadline=None)
@given(
    st.floats(0.05, 1.0),
    st.lists(st.tuples(st.floats(0.0, 0.05), st.floats(0.0, 0.05)), min_size=1, max_size=200),
)
def test_cfs_quota_limits_the_sustained_rate(quota_cpus, chunks):
    """Simulated with a virtual clock: a rank alternates computing (CPU = wall) and blocking. Whatever it does, the
    CPU it gets over the run is at most one quota per period started, plus the one chunk it ran before paying."""
    quota = CfsQuota(quota_cpus=quota_cpus, period_s=0.1)
    now, used = 0.0, 0.0
    for compute_s, blocked_s in chunks:
        now += compute_s
        used += compute_s
        slept = quota.charge(compute_s, now_s=now)
        assert slept >= 0.0
        if slept:
            now += slept
            assert now / 0.1 == pytest.approx(round(now / 0.1), abs=1e-6), "throttling ends at a period boundary"
        now += blocked_s
    periods = now / 0.1 + 1
    assert used <= quota.quota_s * periods + max(c for c, _ in chunks) + 1e-9


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"quota_cpus": 0.0}, "quota_cpus"), ({"quota_cpus": 0.5, "period_s": float("nan")}, "period_s")],
)
def test_cfs_quota_validates(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CfsQuota(**kwargs)


@pytest.mark.timing
def test_cfs_throttle_limits_a_cpu_bound_rank_to_its_quota():
    torch.set_num_threads(1)
    emulator = SlowdownEmulator(factors={0: 4.0}, throttle="cfs", period_ms=50)
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    _fit([emulator], num_batches=16)
    cpu, wall = time.process_time() - cpu_start, time.perf_counter() - wall_start
    assert emulator.total_stretch_s > 0
    # at most a quarter of a CPU, sustained (plus setup before the first batch and one period's slack)
    assert cpu - 0.25 * wall < 0.5 + 0.05, (cpu, wall)
