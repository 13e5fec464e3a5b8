import os
import signal
import subprocess
import sys
import textwrap

import pytest

from lightning_hetero.emulation.config import load_config
from lightning_hetero.emulation.plan import PlanError
from lightning_hetero.emulation.progress import write_progress
from lightning_hetero.emulation.runner import (
    NoProgressError,
    describe_plan,
    plan_levels,
    run_dynamic,
    run_static,
    stop_on_signals,
)


class FakeBackend:
    def __init__(self, host_cpus=2):
        self._host_cpus = host_cpus
        self.applied = []

    def host_cpus(self):
        return self._host_cpus

    def apply(self, updates, reason):
        self.applied.append((reason, [u.cpu_quota for u in updates]))


class FakeClock:
    """Advances one poll interval per sleep; ``on_sleep`` lets a test act as the training side."""

    def __init__(self, on_sleep=None):
        self.now = 1000.0
        self.sleeps = 0
        self.on_sleep = on_sleep

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps += 1
        self.now += seconds
        if self.on_sleep:
            self.on_sleep(self)


def test_static_applies_the_level_once():
    backend = FakeBackend()
    run_static(load_config(overrides=["level=HL4"]), backend)
    assert backend.applied == [("HL4 (static)", [37500, 37500, 25000, 100000])]


def test_dynamic_by_seconds_follows_the_clock():
    config = load_config(
        overrides=["schedule.unit=seconds", "schedule.steps=[{start: 0, level: HL1},{start: 3, level: HL8}]"]
    )
    backend, clock = FakeBackend(), FakeClock()
    run_dynamic(config, backend, clock=clock, sleep=clock.sleep)
    assert [reason for reason, _ in backend.applied] == ["HL1 at seconds 0", "HL8 at seconds 3"]
    assert clock.sleeps == 3


def test_dynamic_by_epoch_follows_the_most_advanced_rank(tmp_path):
    config = load_config(overrides=["schedule=omnilearn-resnet18", f"progress_dir={tmp_path}"])
    write_progress(tmp_path, rank=0, epoch=30, done=True, time_s=1.0)  # a previous run's record: ignored

    def training(clock):
        epoch = clock.sleeps * 3
        write_progress(tmp_path, rank=0, epoch=epoch, time_s=clock.now)
        write_progress(tmp_path, rank=1, epoch=max(0, epoch - 2), time_s=clock.now)

    backend, clock = FakeBackend(), FakeClock(on_sleep=training)
    run_dynamic(config, backend, clock=clock, sleep=clock.sleep)
    reasons = [reason for reason, _ in backend.applied]
    assert reasons == [
        "HL1 at epoch 0",
        "HL2 at epoch 6",
        "HL4 at epoch 12",
        "HL8 at epoch 15",
        "HL4 at epoch 27",
        "HL2 at epoch 30",
        "HL1 at epoch 36",
    ]


def test_dynamic_stops_when_training_is_done(tmp_path):
    config = load_config(overrides=["schedule=omnilearn-resnet50", f"progress_dir={tmp_path}"])

    def training(clock):
        write_progress(tmp_path, rank=0, epoch=clock.sleeps, done=clock.sleeps == 2, time_s=clock.now)

    backend, clock = FakeBackend(), FakeClock(on_sleep=training)
    run_dynamic(config, backend, clock=clock, sleep=clock.sleep)
    assert backend.applied == [("HL1 at epoch 0", [50000] * 4)]
    assert clock.sleeps == 2


def test_dynamic_by_epoch_gives_up_without_training_progress(tmp_path):
    config = load_config(overrides=["schedule=omnilearn-resnet18", f"progress_dir={tmp_path}", "progress_timeout_s=5"])

    def training(clock):  # reports epoch 0 once, after two polls, and then nothing
        if clock.sleeps == 2:
            write_progress(tmp_path, rank=0, epoch=0, time_s=clock.now)

    backend, clock = FakeBackend(), FakeClock(on_sleep=training)
    with pytest.raises(NoProgressError, match=f"no training progress in {tmp_path} for 6 s .*ProgressReporter"):
        run_dynamic(config, backend, clock=clock, sleep=clock.sleep)
    assert clock.sleeps == 2 + 6  # the clock restarted at the record
    assert backend.applied == [("HL1 at epoch 0", [50000] * 4)]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signals_interrupt_the_block_even_where_sigint_was_ignored(signum):
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a job a script starts with `&`
    try:
        with pytest.raises(KeyboardInterrupt) as interrupt, stop_on_signals():
            os.kill(os.getpid(), signum)
        assert interrupt.value.signum == signum
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # restored
    finally:
        signal.signal(signal.SIGINT, before)


def test_background_job_of_a_script_stops_on_sigint(tmp_path):
    emulator = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from lightning_hetero.emulation.config import load_config
        from lightning_hetero.emulation.runner import run_dynamic

        class Backend:
            def host_cpus(self):
                return 2
            def apply(self, updates, reason):
                Path({str(tmp_path / "applied")!r}).touch()

        config = load_config(overrides=["schedule=omnilearn-resnet18", "progress_dir={tmp_path}", "poll_interval_s=0.05"])
        try:
            run_dynamic(config, Backend())  # no training: it polls
        except KeyboardInterrupt as interrupt:
            sys.exit(128 + interrupt.signum)
    """)
    (tmp_path / "emulator.py").write_text(emulator)
    script = f"""
        {sys.executable} {tmp_path / "emulator.py"} &
        pid=$!
        while [ ! -e {tmp_path / "applied"} ]; do sleep 0.1; done
        kill -INT $pid
        wait $pid
    """
    result = subprocess.run(["bash", "-c", script], timeout=120, capture_output=True, text=True)
    assert result.returncode == 130, result.stderr


def test_every_scheduled_level_is_checked_before_the_first_update():
    config = load_config(
        overrides=[
            "levels.too_big=['0','1','2','0-7']",
            "schedule.unit=seconds",
            "schedule.steps=[{start: 0, level: HL1},{start: 60, level: too_big}]",
        ]
    )
    backend = FakeBackend(host_cpus=4)
    with pytest.raises(PlanError, match="level too_big, container worker4: cpuset 0-7 names cores"):
        run_dynamic(config, backend, clock=FakeClock(), sleep=FakeClock().sleep)
    assert backend.applied == []


def test_describe_plan_lists_each_transition():
    config = load_config(overrides=["schedule.steps=[{start: 0, level: HL1},{start: 2, level: HL2}]"])
    lines = describe_plan(config, host_cpus=2)
    assert lines[0] == "epoch 0: HL1:"
    assert lines[5] == "epoch 2: HL2:"
    assert lines[8] == "  worker3: cpuset_cpus=0-1 cpu_quota=33300 cpu_period=100000"
    assert list(plan_levels(config, host_cpus=2)) == ["HL1", "HL2"]


def test_nothing_to_emulate():
    with pytest.raises(ValueError, match="nothing to emulate"):
        plan_levels(load_config(), host_cpus=2)
