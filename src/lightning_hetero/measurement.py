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
from typing import Any


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
    validation run).

    Example::

        >>> timer = BusyTimer(clock=iter([0.0, 0.100, 0.160, 0.250, 0.260]).__next__)
        >>> timer.step_start()  # no earlier step
        >>> timer.add_wait(0.040)
        >>> round(timer.step_start(), 3)  # 100 ms wall, 40 ms waiting
        0.06
        >>> with timer.waiting():  # from 0.160 s to 0.250 s
        ...     pass
        >>> round(timer.step_start(), 3)  # this step lasted 160 ms, 90 ms of which waiting
        0.07
    """

    def __init__(self, clock: Any = time.perf_counter) -> None:
        self._clock = clock
        self._start: float | None = None
        self._wait_s = 0.0
        #: wall seconds of the last measured step (the synchronous step time, the same on every rank)
        self.last_wall_s: float | None = None

    def step_start(self) -> float | None:
        """Close the open step (returning its busy seconds, or ``None`` if none was open) and open a new one."""
        now = self._clock()
        busy = None
        self.last_wall_s = None
        if self._start is not None:
            self.last_wall_s = now - self._start
            busy = max(0.0, self.last_wall_s - self._wait_s)
        self._start = now
        self._wait_s = 0.0
        return busy

    def add_wait(self, seconds: float) -> None:
        if self._start is not None and seconds > 0:
            self._wait_s += seconds

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Time the enclosed block as waiting."""
        start = self._clock()
        try:
            yield
        finally:
            self.add_wait(self._clock() - start)

    def skip(self) -> None:
        """Do not measure the open step."""
        self._start = None
        self._wait_s = 0.0


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
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
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


class StepCostModel:
    """A rank's compute time per step as ``overhead_s + per_sample_s x batch``, fitted from recent steps.

    Samples per second is not independent of the batch size: a step also pays a fixed cost (Python, hooks,
    kernel launches), which dominates small batches. A controller that assumed pure proportionality would see a
    rank given a small batch as slow, shrink its batch further, and so on down to the minimum. This model learns
    the fixed part whenever recent steps used different batch sizes (least squares over the last ``window``
    steps), keeps it while the batch size stays put, and tracks the per-sample part with an EWMA.

    Args:
        smoothing: EWMA weight of the newest step in the per-sample cost.
        window: recent steps kept for fitting the fixed cost.
        warmup_steps: measurements discarded at the start and after :meth:`restart_warmup`.
        min_spread: the fixed cost is refitted only when the window's batch sizes spread by at least this fraction
            of their mean (closer sizes give a noisy intercept).

    Example::

        >>> model = StepCostModel(smoothing=1.0, warmup_steps=0)
        >>> for batch in (32, 32, 16, 16):
        ...     model.update(batch, 0.002 + 0.0001 * batch)
        >>> round(model.overhead_s, 6), round(model.per_sample_s, 6)
        (0.002, 0.0001)
        >>> round(model.step_time_s(64), 6)
        0.0084
    """

    def __init__(
        self, smoothing: float = 0.5, window: int = 16, warmup_steps: int = 3, min_spread: float = 0.1
    ) -> None:
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        if window < 2:
            raise ValueError(f"window must be >= 2, got {window}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.smoothing = smoothing
        self.window = window
        self.warmup_steps = warmup_steps
        self.min_spread = min_spread
        self._to_skip = warmup_steps
        self._recent: list[tuple[int, float]] = []
        self.overhead_s = 0.0
        self.per_sample_s: float | None = None

    def update(self, samples: int, compute_s: float) -> None:
        if samples <= 0 or not math.isfinite(compute_s) or compute_s <= 0:
            return
        if self._to_skip > 0:
            self._to_skip -= 1
            return
        self._recent = [*self._recent[-(self.window - 1) :], (samples, compute_s)]
        self._refit_overhead()
        overhead = min(self.overhead_s, 0.9 * compute_s)
        newest = (compute_s - overhead) / samples
        self.per_sample_s = (
            newest if self.per_sample_s is None else (1 - self.smoothing) * self.per_sample_s + self.smoothing * newest
        )

    def _refit_overhead(self) -> None:
        sizes = [b for b, _ in self._recent]
        mean_b = sum(sizes) / len(sizes)
        if (max(sizes) - min(sizes)) / mean_b < self.min_spread:
            return
        times = [t for _, t in self._recent]
        mean_t = sum(times) / len(times)
        var_b = sum((b - mean_b) ** 2 for b in sizes)
        slope = sum((b - mean_b) * (t - mean_t) for b, t in self._recent) / var_b
        intercept = mean_t - slope * mean_b
        self.overhead_s = min(max(intercept, 0.0), 0.9 * min(times))

    @property
    def ready(self) -> bool:
        return self.per_sample_s is not None

    def step_time_s(self, batch: int) -> float:
        """Predicted compute seconds for a step of ``batch`` samples."""
        if self.per_sample_s is None:
            raise ValueError("no measurement yet")
        return self.overhead_s + self.per_sample_s * batch

    def restart_warmup(self, steps: int | None = None) -> None:
        """Discard the next ``steps`` (default ``warmup_steps``) measurements."""
        self._to_skip = self.warmup_steps if steps is None else steps

    def state_dict(self) -> dict[str, Any]:
        return {"overhead_s": self.overhead_s, "per_sample_s": self.per_sample_s}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.overhead_s, self.per_sample_s = state["overhead_s"], state["per_sample_s"]
