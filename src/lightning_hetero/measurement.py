"""Per-rank compute telemetry: how long a rank computes in a step, and its smoothed throughput.

Under DDP the gradient all-reduce makes every rank's step as long as the slowest rank's, so wall time per step
says nothing about a rank's own speed. :class:`ComputeTimer` measures from the start of a step (after the batch
has been fetched) to the moment the rank's gradients are ready to leave (the last DDP communication-hook call, or
the point where a strategy sends them); time spent waiting for data or for other ranks is outside that window.
:class:`ThroughputMeter` turns those windows into a smoothed samples-per-second figure.

A compute window cannot see a CPU quota's long-run limit: a throttled rank that waited in the last all-reduce
starts the next step with a fresh budget and may finish its window unthrottled, then be throttled after it.
:class:`BusyTimer` measures what a rank's sustained rate needs: the wall time from one step's start to the next
minus the time spent waiting for other ranks (every collective), i.e. everything the rank itself had to do.

Both are plain objects with no torch.distributed in them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lightning_hetero._validation import check_range
from lightning_hetero.step_clock import HostClock, StepClock


class ComputeTimer:
    """Times one rank's compute window in a step.

    ``start()`` opens the window; ``mark_compute_end()`` may be called several times (once per gradient bucket) and
    the last call before ``elapsed_s()`` closes it.

    Example::

        >>> timer = ComputeTimer(clock=iter([10.0, 10.5, 10.75]).__next__)
        >>> timer.start()
        >>> timer.mark_compute_end()
        >>> timer.mark_compute_end()
        >>> timer.elapsed_s()
        0.75
    """

    def __init__(self, clock: Any = time.perf_counter) -> None:
        self._clock = clock
        self._start: float | None = None
        self._end: float | None = None

    def start(self) -> None:
        self._start = self._clock()
        self._end = None

    def mark_compute_end(self) -> None:
        if self._start is not None:
            self._end = self._clock()

    @property
    def running(self) -> bool:
        return self._start is not None and self._end is None

    def elapsed_s(self) -> float | None:
        """The closed window's length, or ``None`` when the step has not been started and ended."""
        if self._start is None or self._end is None:
            return None
        return self._end - self._start


class BusyTimer:
    """A rank's busy seconds per step: wall time between consecutive step starts minus time spent waiting for others.

    Waiting is whatever the caller reports with :meth:`add_wait` or times with :meth:`waiting` (collectives: the
    gradient all-reduce after the rank's own backward, DDP's buffer broadcast, ``sync_dist`` logging, barriers).
    Everything else in the step, including a CPU quota's throttling wherever it lands, data loading and the
    optimizer step, is the rank's own cost. A step can be excluded with :meth:`skip` (an epoch boundary, a
    validation run). ``cpu_clock=None`` reads no CPU time (``last_cpu_s`` stays ``None``): without a CPU quota it is
    not needed, and the process CPU clock can cost tens of microseconds per read in a VM whose other threads run.

    ``clock`` is a function of the host's time or a :class:`~lightning_hetero.step_clock.StepClock` (CUDA events,
    whose steps :meth:`close_step` hands out unread so that nothing waits for the device each step).

    Example::

        >>> timer = BusyTimer(clock=iter([0.0, 0.100, 0.160, 0.250, 0.260]).__next__, cpu_clock=lambda: 0.0)
        >>> timer.step_start()  # no earlier step
        >>> timer.add_wait(0.040)
        >>> round(timer.step_start(), 3)  # 100 ms wall, 40 ms waiting
        0.06
        >>> with timer.waiting():  # from 0.160 s to 0.250 s
        ...     pass
        >>> round(timer.step_start(), 3)  # this step lasted 160 ms, 90 ms of which waiting
        0.07
    """

    def __init__(self, clock: Any = time.perf_counter, cpu_clock: Any | None = time.process_time) -> None:
        self.step_clock: StepClock = clock if isinstance(clock, StepClock) else HostClock(clock)
        self.cpu_clock = cpu_clock
        self._start: Any = None
        self._cpu_start: float | None = 0.0
        self._ready: Any = None
        self._wait_s = 0.0
        self._waits: list[tuple[Any, Any]] = []
        #: wall seconds of the last measured step (the synchronous step time, the same on every rank)
        self.last_wall_s: float | None = None
        #: CPU seconds (``cpu_clock``) the process used in the last measured step
        self.last_cpu_s: float | None = None

    def close_step(self) -> StepSpan | None:
        """Close the open step (returning it unread, or ``None`` if none was open) and open a new one."""
        now, cpu = self.step_clock.stamp(), None if self.cpu_clock is None else self.cpu_clock()
        span = None
        self.last_cpu_s = None
        if self._start is not None:
            self.last_cpu_s = None if cpu is None or self._cpu_start is None else cpu - self._cpu_start
            span = StepSpan(self.step_clock, self._start, now, self._waits, self._wait_s)
        self._start, self._cpu_start = now, cpu
        self._ready = None
        self._wait_s, self._waits = 0.0, []
        return span

    def step_start(self) -> float | None:
        """Close the open step (returning its busy seconds, or ``None`` if none was open) and open a new one."""
        span = self.close_step()
        self.last_wall_s = None if span is None else span.wall_s()
        return None if span is None else span.busy_s()

    def mark_ready(self) -> None:
        """The rank's gradients are ready to leave (may be called once per gradient bucket; the last call counts)."""
        if self._start is not None:
            self._ready = self.step_clock.stamp()

    def close_ready(self) -> None:
        """The collective started at the last :meth:`mark_ready` has returned: the time since was waiting."""
        if self._ready is not None:
            self.close_wait(self._ready)
            self._ready = None

    def add_wait(self, seconds: float) -> None:
        if self._start is not None and seconds > 0:
            self._wait_s += seconds

    def open_wait(self) -> Any:
        """Mark the start of a wait; :meth:`close_wait` with the returned stamp ends it."""
        return self.step_clock.stamp()

    def close_wait(self, opened: Any) -> None:
        if self._start is not None:
            self._waits.append((opened, self.step_clock.stamp()))

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Time the enclosed block as waiting."""
        opened = self.open_wait()
        try:
            yield
        finally:
            self.close_wait(opened)

    def skip(self) -> None:
        """Do not measure the open step."""
        self._start = None
        self._ready = None
        self._wait_s, self._waits = 0.0, []


class StepSpan:
    """One closed step as its clock's stamps: read (waiting for the device if need be) only when asked.

    Example::

        >>> from lightning_hetero.step_clock import HostClock
        >>> span = StepSpan(HostClock(), start=0.0, end=0.1, waits=[(0.05, 0.08)], wait_s=0.01)
        >>> round(span.wall_s(), 3), round(span.busy_s(), 3), span.done()
        (0.1, 0.06, True)
    """

    def __init__(self, clock: StepClock, start: Any, end: Any, waits: list[tuple[Any, Any]], wait_s: float) -> None:
        self.clock, self.start, self.end, self.waits, self.wait_s = clock, start, end, waits, wait_s

    def done(self) -> bool:
        """Whether reading the span would not wait (its end has been reached)."""
        return self.clock.done(self.end)

    def wall_s(self) -> float:
        return self.clock.seconds(self.start, self.end)

    def busy_s(self) -> float:
        waits = self.wait_s + sum(self.clock.seconds(a, b) for a, b in self.waits)
        return max(0.0, self.wall_s() - waits)


class ThroughputMeter:
    """An exponentially weighted moving average of samples per second, after discarding warm-up steps.

    Args:
        smoothing: EWMA weight of the newest measurement, in (0, 1]; 1 keeps only the last one.
        warmup_steps: measurements discarded at the start and after :meth:`restart_warmup` (first steps pay for
            allocator growth, DDP bucket rebuilding and cold caches).

    Example::

        >>> meter = ThroughputMeter(smoothing=0.5, warmup_steps=1)
        >>> meter.update(samples=32, compute_s=1.0)  # warm-up, discarded
        >>> meter.update(samples=32, compute_s=0.5)
        64.0
        >>> meter.update(samples=32, compute_s=1.0)
        48.0
    """

    def __init__(self, smoothing: float = 0.3, warmup_steps: int = 3) -> None:
        check_range("smoothing", smoothing, low=0, high=1, low_open=True)
        check_range("warmup_steps", warmup_steps, low=0, integer=True)
        self.smoothing = smoothing
        self.warmup_steps = warmup_steps
        self._to_skip = warmup_steps
        self.value: float | None = None
        self.last: float | None = None
        self.count = 0

    def update(self, samples: int, compute_s: float) -> float | None:
        """Add one step's measurement; return the smoothed throughput (``None`` while still warming up)."""
        if samples <= 0 or not math.isfinite(compute_s) or compute_s <= 0:
            return self.value
        if self._to_skip > 0:
            self._to_skip -= 1
            return self.value
        self.last = samples / compute_s
        self.value = self.last if self.value is None else (1 - self.smoothing) * self.value + self.smoothing * self.last
        self.count += 1
        return self.value

    def restart_warmup(self, steps: int | None = None) -> None:
        """Discard the next ``steps`` (default ``warmup_steps``) measurements, keeping the current average."""
        self._to_skip = self.warmup_steps if steps is None else steps

    def reset(self) -> None:
        """Forget the average entirely (for example when a rank's hardware is known to have changed)."""
        self.value = self.last = None
        self.count = 0
        self._to_skip = self.warmup_steps

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "last": self.last, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value, self.last, self.count = state["value"], state["last"], state["count"]


def sustained_step_s(busy_s: float, cpu_s: float | None, quota_cpus: float | None) -> float:
    """A step's cost to a rank that may use ``quota_cpus`` CPUs on average (a CFS quota), at least its busy time.

    A throttled rank that waits for others in collectives gets its quota refilled meanwhile, so at a split where it
    does not limit the step it looks as fast as an unthrottled one (busy = its CPU time), and given more samples it
    falls off a cliff. Its sustained cost is ``cpu_s / quota_cpus``: what the step would take if it had to earn its
    CPU time at the quota's rate. Without a quota (or without CPU figures) this is the busy time.

    Example::

        >>> sustained_step_s(busy_s=0.010, cpu_s=0.009, quota_cpus=0.25)  # 9 ms of CPU at a quarter CPU
        0.036
        >>> sustained_step_s(busy_s=0.040, cpu_s=0.009, quota_cpus=None)
        0.04
    """
    if quota_cpus is None or cpu_s is None or not math.isfinite(quota_cpus) or quota_cpus <= 0:
        return busy_s
    return max(busy_s, cpu_s / quota_cpus)


def cgroup_cpu_quota(root: str | Path = "/sys/fs/cgroup") -> float | None:
    """This process's CFS CPU quota in CPUs (Docker's ``--cpus``), or ``None`` when unlimited or not readable.

    Reads cgroup v2 ``cpu.max`` (``"25000 100000"``) or cgroup v1 ``cpu/cpu.cfs_quota_us`` and
    ``cpu/cpu.cfs_period_us`` under ``root`` (inside a container, the container's own cgroup).

    Example::

        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as root:
        ...     _ = (Path(root) / "cpu.max").write_text("25000 100000")
        ...     cgroup_cpu_quota(root)
        0.25
    """
    root = Path(root)
    try:
        v2 = root / "cpu.max"
        if v2.exists():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us


def close_compute_window(timer: ComputeTimer, meter: ThroughputMeter, samples: int) -> float | None:
    """End a step's compute window: feed ``samples`` over the window ``timer`` measured to ``meter``.

    Both callbacks time the same window (batch start to the end of backward) and feed it the same way; this is that
    one step. Returns the meter's value after the update (``None`` while it has none), and ``None`` without feeding
    the meter when the window was not both opened and closed.

    Example::

        >>> timer, meter = ComputeTimer(clock=iter([0.0, 0.5]).__next__), ThroughputMeter(warmup_steps=0)
        >>> close_compute_window(timer, meter, samples=32) is None  # no window opened yet
        True
        >>> timer.start(); timer.mark_compute_end()
        >>> close_compute_window(timer, meter, samples=32)
        64.0
    """
    elapsed = timer.elapsed_s()
    return None if elapsed is None else meter.update(samples, elapsed)
