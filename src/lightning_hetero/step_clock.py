"""The clocks a rank's steps are timed with: the host's wall clock, CUDA events, or a fake device for tests.

On a CPU the host runs the step, so the wall clock sees its compute. On CUDA a kernel launch returns at once and the
host blocks only at the next synchronisation, so host time would show every rank the whole synchronous step.
:class:`CudaEventClock` records events on the compute stream instead; they are read lazily (:meth:`~StepClock.done`
polls without blocking, :meth:`~StepClock.seconds` waits for the later event), so timing adds no host
synchronisation per step. :class:`FakeDevice` is a device queue whose events complete later than the host's calls
return, so the same logic is tested without a GPU.

Every clock offers :meth:`~StepClock.stamp` (an opaque mark, now on the host or at this point of the device's queue),
:meth:`~StepClock.seconds` between two stamps, and :meth:`~StepClock.done` (whether a stamp can be read without
waiting).

Example::

    >>> host = HostClock(now=iter([1.0, 1.25]).__next__)
    >>> start, end = host.stamp(), host.stamp()
    >>> host.seconds(start, end), host.done(end)
    (0.25, True)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class StepClock(Protocol):
    """What :class:`~lightning_hetero.measurement.BusyTimer` times a step with."""

    def stamp(self) -> Any:
        """A mark of now (on the host) or of this point in the device's queue."""
        ...

    def seconds(self, start: Any, end: Any) -> float:
        """Seconds from ``start`` to ``end``; may wait for the device to reach ``end``."""
        ...

    def done(self, stamp: Any) -> bool:
        """Whether ``stamp`` can be read without waiting."""
        ...


class HostClock:
    """The host's wall clock (``time.perf_counter``): the clock for CPUs.

    Args:
        now: the function read for each stamp.
    """

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.now = now

    def stamp(self) -> float:
        return self.now()

    def seconds(self, start: float, end: float) -> float:
        return end - start

    def done(self, stamp: float) -> bool:
        return True


class CudaEventClock:
    """CUDA events recorded on the current (compute) stream of ``device``; read without a per-step synchronisation.

    Args:
        device: the CUDA device whose current stream the events are recorded on.

    Example::

        >>> import torch
        >>> if torch.cuda.is_available():
        ...     clock = CudaEventClock(torch.device("cuda"))
        ...     start = clock.stamp(); torch.cuda._sleep(1000); end = clock.stamp()
        ...     assert clock.seconds(start, end) >= 0.0
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._cycles_per_s: float | None = None

    def stamp(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def seconds(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        end.synchronize()
        return start.elapsed_time(end) / 1000.0

    def done(self, stamp: torch.cuda.Event) -> bool:
        return bool(stamp.query())

    def sleep(self, seconds: float) -> None:
        """Queue ``seconds`` of idle spinning on the stream (``torch.cuda._sleep``; its clock rate measured once)."""
        if self._cycles_per_s is None:
            torch.cuda._sleep(1)  # the kernel's first launch may load it (lazy loading): not in the measured window
            torch.cuda.current_stream(self.device).synchronize()
            start = self.stamp()
            torch.cuda._sleep(10_000_000)
            self._cycles_per_s = 10_000_000 / max(self.seconds(start, self.stamp()), 1e-6)
        torch.cuda._sleep(int(seconds * self._cycles_per_s))


class FakeDevice:
    """A device queue for tests: :meth:`launch` returns at once, and the queue runs the work after earlier work.

    A stamp is the time at which the queue reaches it; it is :meth:`done` once the host clock has passed that time.
    :meth:`wait_until` makes the queue wait for something outside it (another rank's part of a collective).

    Args:
        host_now: the host's clock (a fake one in tests).

    Example::

        >>> host = [0.0]
        >>> device = FakeDevice(lambda: host[0])
        >>> start = device.stamp(); device.launch(0.030); end = device.stamp()  # the host's calls return at once
        >>> device.seconds(start, end), device.done(end), host[0]
        (0.03, False, 0.0)
        >>> host[0] = 0.05
        >>> device.done(end)
        True
    """

    def __init__(self, host_now: Callable[[], float]) -> None:
        self.host_now = host_now
        self.free_at = 0.0

    def launch(self, seconds: float) -> None:
        """Queue ``seconds`` of work after what is queued."""
        self.free_at = max(self.free_at, self.host_now()) + seconds

    def wait_until(self, when: float) -> None:
        """Queue a wait for an outside event at time ``when`` (a collective that needs the other ranks)."""
        self.free_at = max(self.free_at, self.host_now(), when)

    def sleep(self, seconds: float) -> None:
        """Queue ``seconds`` of idle spinning (what ``torch.cuda._sleep`` does on a GPU)."""
        self.launch(seconds)

    def stamp(self) -> float:
        return max(self.free_at, self.host_now())

    def seconds(self, start: float, end: float) -> float:
        return end - start

    def done(self, stamp: float) -> bool:
        return self.host_now() >= stamp


def step_clock_for(device: torch.device) -> StepClock:
    """The clock for a rank computing on ``device``: CUDA events on CUDA, the host's wall clock elsewhere.

    Example::

        >>> import torch
        >>> type(step_clock_for(torch.device("cpu"))).__name__
        'HostClock'
    """
    if device.type == "cuda":
        return CudaEventClock(device)
    return HostClock()
