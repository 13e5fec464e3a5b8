"""``SlowdownEmulator`` on a device: a slowed rank's compute stretched on the device's own queue, not on the host.

On CUDA a host sleep only delays kernel launches, which a device with queued work may not even notice. Here each
step's device compute (batch start to its gradients ready, timed by a :class:`~lightning_hetero.step_clock.StepClock`
on the compute stream) is measured lazily, and before backward the rank queues ``(factor - 1)`` times the median of
recent measured steps as device idle time (``torch.cuda._sleep`` on CUDA), so a rank with factor ``f`` computes
``f`` times slower on the device while its host calls return at once.

Example::

    >>> from lightning_hetero.step_clock import FakeDevice
    >>> host = [0.0]
    >>> device = FakeDevice(lambda: host[0])
    >>> stretch = DeviceStretch(device)
    >>> for step in range(3):
    ...     stretch.batch_start(); device.launch(0.010); stretch.before_backward(factor=3.0); stretch.compute_end()
    ...     host[0] = device.free_at  # the host waits for the device now and then
    >>> round(stretch.stretched_s, 3)  # steps 2 and 3 each stretched by 2 x 10 ms
    0.04
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # emulation imports torch only in slowdown.py and reporter.py
    from lightning_hetero.step_clock import StepClock


class DeviceStretch:
    """Stretches a rank's device compute by its slowdown factor (see the module's description).

    Args:
        clock: the device's clock; it must offer ``sleep(seconds)`` (queued idle time), as
            :class:`~lightning_hetero.step_clock.CudaEventClock` and :class:`~lightning_hetero.step_clock.FakeDevice`
            do.
        window: how many recent measured steps the median is taken over.
    """

    def __init__(self, clock: StepClock, window: int = 5) -> None:
        self.clock = clock
        self._pending: deque[tuple[Any, Any, Any]] = deque()
        self._computed_s: deque[float] = deque(maxlen=window)
        self._start: Any = None
        self._stretch: tuple[Any, Any] | None = None
        #: seconds of device idle time queued since the fit started
        self.stretched_s = 0.0

    def batch_start(self) -> None:
        self._start = self.clock.stamp()

    def before_backward(self, factor: float) -> None:
        """Queue this step's stretch: ``factor - 1`` times the median measured compute (none until one is read)."""
        self._read_done()
        self._stretch = None
        if factor > 1.0 and self._computed_s:
            seconds = (factor - 1.0) * statistics.median(self._computed_s)
            before = self.clock.stamp()
            self.clock.sleep(seconds)  # type: ignore[attr-defined]
            self._stretch = (before, self.clock.stamp())
            self.stretched_s += seconds

    def compute_end(self) -> None:
        """The step's gradients are ready (before any all-reduce wait): its compute, less the stretch, is kept."""
        if self._start is not None:
            self._pending.append((self._start, self.clock.stamp(), self._stretch))
            self._start = None

    def _read_done(self) -> None:
        while self._pending and self.clock.done(self._pending[0][1]):
            start, end, stretch = self._pending.popleft()
            stretched = 0.0 if stretch is None else self.clock.seconds(*stretch)
            self._computed_s.append(self.clock.seconds(start, end) - stretched)
