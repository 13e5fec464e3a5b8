"""Per-rank compute telemetry: how long a rank computes in a step, and its smoothed throughput.

Under DDP the gradient all-reduce makes every rank's step as long as the slowest rank's, so wall time per step
says nothing about a rank's own speed. :class:`ComputeTimer` measures from the start of a step (after the batch
has been fetched) to the moment the rank's gradients are ready to leave (the last DDP communication-hook call, or
the point where a strategy sends them); time spent waiting for data or for other ranks is outside that window.
:class:`ThroughputMeter` turns those windows into a smoothed samples-per-second figure.

Both are plain objects with no torch.distributed in them.
"""

from __future__ import annotations

import math
import time
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
