"""What a rank's measured busy window leaves out: every wait for another rank, the CPU quota it runs under, and the
kernels of another rank on the same GPU.

A fast rank that waits for a slow one inside its timed window would look slow. HeteroBatch therefore marks the end
of a rank's own compute (:class:`ComputeEndMarks`, called by the gradient hook before the all-reduce waits), times
DDP's buffer broadcast and the strategy's collectives as waits (:class:`WaitExclusion`), and costs a step under a
CPU quota at least at the quota's rate (:func:`quota_source`); :func:`start_measuring` sets all of this up at fit
start. The measured steps reach the tuner through :class:`PendingSteps`, each once its clock can read it.

Ranks that share one GPU cannot be measured apart: a GPU runs one process's kernels at a time (without MPS), so a
rank's CUDA-event step times include the time the others' kernels held the device, the fast rank looks slower than
it is and the split comes out too even. Measured on one H200 with two ranks, rank 1 slowed 3x: HeteroBatch settled
at 176/80 where the best fixed split tried was 208/48, 0.83 of its throughput (docs/results.md, "GPU"). At fit start
each CUDA rank's device is identified (host and GPU UUID), the ids are gathered, and ranks that share a device are
warned about once (:func:`warn_shared_devices`); nothing else changes.

Example::

    >>> shared_devices(["a/GPU-1", "a/GPU-1", "b/GPU-1", "a/GPU-2"])
    [[0, 1]]
    >>> shared_devices(["", ""])  # not CUDA: never shared
    []
"""

from __future__ import annotations

import hashlib
import logging
import socket
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import torch
from lightning.pytorch.strategies import Strategy
from torch.nn.parallel import DistributedDataParallel

from lightning_hetero.contracts import CpuQuotaClock, HeteroBatchStrategy
from lightning_hetero.hetero_batch.period import gather_rows
from lightning_hetero.measurement import BusyTimer, ComputeTimer, StepSpan, cgroup_cpu_quota, sustained_step_s
from lightning_hetero.step_clock import HostClock, step_clock_for

#: strategy methods that run collectives; time spent in them is waiting for other ranks, not this rank's cost
COLLECTIVES = ("reduce", "all_gather", "broadcast", "barrier")


class ComputeEndMarks:
    """Passed where a :class:`ComputeTimer` is expected: the end of a rank's compute also starts its wait.

    Example::

        >>> busy, timer = BusyTimer(), ComputeTimer()
        >>> timer.start()
        >>> ComputeEndMarks(timer, busy).mark_compute_end()
        >>> timer.running, timer.elapsed_s() is not None
        (False, True)
    """

    def __init__(self, timer: ComputeTimer, busy: BusyTimer) -> None:
        self.timer, self.busy = timer, busy

    def mark_compute_end(self) -> None:
        self.timer.mark_compute_end()
        self.busy.mark_ready()


class WaitExclusion:
    """Counts DDP's buffer broadcast and the strategy's collectives as waits of ``busy``, until :meth:`remove`.

    Example::

        >>> class Strategy:
        ...     def barrier(self, name=None):
        ...         return "done"
        >>> strategy, busy = Strategy(), BusyTimer()
        >>> exclusion = WaitExclusion(busy)
        >>> exclusion.exclude_strategy_collectives(strategy)
        >>> strategy.barrier(), "barrier" in vars(strategy)
        ('done', True)
        >>> exclusion.remove(strategy)
        >>> "barrier" in vars(strategy)
        False
    """

    def __init__(self, busy: BusyTimer) -> None:
        self.busy = busy
        self._handles: list[Any] = []
        self._wrapped: list[str] = []
        self._forward_started: Any = None

    def exclude_buffer_broadcast(self, ddp: DistributedDataParallel) -> None:
        """DDP broadcasts buffers (BatchNorm statistics) from rank 0 inside its forward, before it calls the wrapped
        module: the time between the two forward pre-hooks is waiting for rank 0, not this rank's compute."""

        def outer(*_: Any) -> None:
            self._forward_started = self.busy.open_wait()

        def inner(*_: Any) -> None:
            if self._forward_started is not None:
                self.busy.close_wait(self._forward_started)
                self._forward_started = None

        self._handles += [ddp.register_forward_pre_hook(outer), ddp.module.register_forward_pre_hook(inner)]

    def exclude_strategy_collectives(self, strategy: Any) -> None:
        """``self.log(..., sync_dist=True)``, barriers and HeteroBatch's own exchange go through these methods; an
        instance attribute shadows each method for this fit and is removed again by :meth:`remove`."""
        for name in COLLECTIVES:
            method = getattr(strategy, name, None)
            if method is None or name in vars(strategy):
                continue

            def timed(*args: Any, _method: Callable[..., Any] = method, **kwargs: Any) -> Any:
                with self.busy.waiting():
                    return _method(*args, **kwargs)

            setattr(strategy, name, timed)
            self._wrapped.append(name)

    def remove(self, strategy: Any) -> None:
        """Take the hooks and the shadowing methods away again."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for name in self._wrapped:
            vars(strategy).pop(name, None)
        self._wrapped = []


class PendingSteps:
    """Measured steps not yet handed to the tuner, in order: a step timed on a device is read once its events have
    completed (polled, never waited for), and every step at an adjustment (:meth:`feed` with ``wait=True``).

    Example::

        >>> from lightning_hetero.step_clock import FakeDevice
        >>> host = [0.0]
        >>> device = FakeDevice(lambda: host[0])
        >>> busy, fed = BusyTimer(clock=device, cpu_clock=None), []
        >>> class Tuner:
        ...     def record_step(self, split, busy_s, floor_s, wall_s): fed.append(round(busy_s, 3))
        ...     def skip_next(self): fed.append("skip")
        >>> pending = PendingSteps()
        >>> busy.close_step(); device.launch(0.02)  # a step's kernels: the host returns at once
        >>> pending.add((8, 8), busy.close_step(), floor_s=0.0); pending.skip_next()
        >>> pending.feed(Tuner()); fed  # the device has not reached the step's end yet
        []
        >>> pending.feed(Tuner(), wait=True); fed
        [0.02, 'skip']
    """

    def __init__(self) -> None:
        self._queue: deque[tuple[tuple[int, ...], StepSpan, float] | None] = deque()
        #: the split of the step in progress (``None`` before the first)
        self.split: tuple[int, ...] | None = None
        #: the CPUs the rank's quota allows (:func:`quota_source`; ``None``: no quota)
        self.quota: Callable[[], float | None] = lambda: None

    def next_step(self, span: StepSpan | None, cpu_s: float | None, split: tuple[int, ...], tuner: Any) -> None:
        """The step in progress ended (``span``: ``None`` where it is not measured; ``cpu_s`` its CPU seconds, which
        cost it at least their time at the quota's rate, see :func:`~lightning_hetero.measurement.sustained_step_s`)
        and the next one runs at ``split``, whose first step is not measured when the split changed (it pays for the
        change: allocator, caches); ``tuner`` is handed the steps that can be read now.

        Example::

            >>> class Tuner:
            ...     def skip_next(self): print("the next step is not measured")
            >>> pending = PendingSteps()
            >>> pending.next_step(None, None, (8, 8), Tuner())
            >>> pending.next_step(None, None, (12, 4), Tuner())
            the next step is not measured
        """
        if span is not None and self.split is not None:
            self.add(self.split, span, sustained_step_s(0.0, cpu_s, self.quota()))
        if self.split is not None and split != self.split:
            self.skip_next()
        self.feed(tuner)
        self.split = split

    def add(self, split: tuple[int, ...], span: StepSpan, floor_s: float) -> None:
        self._queue.append((split, span, floor_s))

    def skip_next(self) -> None:
        """The tuner is not to measure the step after those added so far."""
        self._queue.append(None)

    def feed(self, tuner: Any, wait: bool = False) -> None:
        """Hand ``tuner`` the steps that can be read now (all of them, waiting for the device, with ``wait``)."""
        while self._queue:
            entry = self._queue[0]
            if entry is not None and not wait and not entry[1].done():
                return
            self._queue.popleft()
            if entry is None:
                tuner.skip_next()
            else:
                split, span, floor_s = entry
                tuner.record_step(split, span.busy_s(), floor_s, span.wall_s())


def quota_source(callbacks: Iterable[Any], busy: BusyTimer) -> Callable[[], float | None]:
    """Where the rank's CPU quota comes from: an in-process :class:`~lightning_hetero.contracts.CpuQuotaClock` among
    ``callbacks`` when one emulates a quota (whose CPU clock ``busy`` then reads), else the cgroup, read once; with
    neither, ``busy`` reads no CPU clock (the floor needs a quota, and the process CPU clock costs time every step).

    Example::

        >>> class Quota:
        ...     emulates_cpu_quota, cpu_quota = True, 0.25
        ...     def cpu_clock(self): return 1.5
        >>> busy = BusyTimer()
        >>> source = quota_source([object(), Quota()], busy)
        >>> source(), busy.cpu_clock()
        (0.25, 1.5)
    """
    clocks = [cb for cb in callbacks if isinstance(cb, CpuQuotaClock) and cb.emulates_cpu_quota]
    if clocks:
        busy.cpu_clock = clocks[0].cpu_clock
        return lambda: clocks[0].cpu_quota
    quota = cgroup_cpu_quota()
    if quota is None:
        busy.cpu_clock = None
    return lambda: quota


log = logging.getLogger(__name__)


def device_id(device: torch.device) -> str:
    """This process's GPU as ``"<host>/<uuid>"``; ``""`` when ``device`` is not CUDA.

    Example::

        >>> device_id(torch.device("cpu"))
        ''
    """
    if device.type != "cuda":
        return ""
    return f"{socket.gethostname()}/{torch.cuda.get_device_properties(device).uuid}"


def shared_devices(ids: list[str]) -> list[list[int]]:
    """The groups of ranks (two or more, in rank order) whose ``ids`` are equal and not empty."""
    groups: dict[str, list[int]] = {}
    for rank, ident in enumerate(ids):
        if ident:
            groups.setdefault(ident, []).append(rank)
    return [ranks for ranks in groups.values() if len(ranks) > 1]


def _key(ident: str) -> int:
    """A 60-bit integer for ``ident`` (0 for ``""``), to gather as a tensor on any backend."""
    return int(hashlib.sha1(ident.encode()).hexdigest()[:15], 16) if ident else 0


def shared_device_warning(ids: list[str]) -> str | None:
    """The warning for the ranks of ``ids`` (one per rank) that share a GPU; ``None`` when none do.

    Example::

        >>> shared_device_warning(["h/GPU-1", "h/GPU-1"])[:45]
        'HeteroBatch: ranks 0, 1 share one GPU. Each r'
        >>> shared_device_warning(["h/GPU-1", "h/GPU-2"]) is None
        True
    """
    groups = shared_devices(ids)
    if not groups:
        return None
    names = "; ".join("ranks " + ", ".join(map(str, ranks)) for ranks in groups)
    return (
        f"HeteroBatch: {names} share one GPU. Each rank's step times then include the others' kernels, so the split "
        "comes out too even (0.83 of the best fixed split measured on one H200); give each rank its own GPU"
    )


def warn_shared_devices(strategy: Strategy, device: torch.device, busy: BusyTimer) -> str | None:
    """Gather every rank's device id (:func:`~.period.gather_rows`, the time a wait of ``busy``); rank 0 logs
    :func:`shared_device_warning`, which every rank returns. Collective on CUDA (every rank calls it); elsewhere
    nothing is gathered."""
    if device.type != "cuda" or strategy.world_size < 2:
        return None
    keys = gather_rows(strategy, torch.tensor([_key(device_id(device))], dtype=torch.int64), busy).reshape(-1)
    warning = shared_device_warning([str(key) if key else "" for key in keys.tolist()])
    if warning and strategy.global_rank == 0:
        log.warning(warning)
    return warning


def start_measuring(
    trainer: Any, device: torch.device, timer: ComputeTimer, busy: BusyTimer, exclusion: WaitExclusion
) -> tuple[ComputeEndMarks, Callable[[], float | None]]:
    """At fit start: what ends a rank's compute (the marks the gradient hook or the strategy calls), the step clock
    (CUDA events on the compute stream), the shared-GPU warning, the waits excluded from ``busy`` (DDP's buffer
    broadcast, unless the strategy offers :class:`~lightning_hetero.contracts.HeteroBatchStrategy`; the strategy's
    collectives) and where the CPU quota comes from (:func:`quota_source`). Collective on CUDA (every rank calls it).

    Returns:
        the compute-end marks and the CPU quota's source.
    """
    strategy, marks = trainer.strategy, ComputeEndMarks(timer, busy)
    if isinstance(busy.step_clock, HostClock):  # an injected clock is kept
        busy.step_clock = step_clock_for(device)
    warn_shared_devices(strategy, device, busy)
    if not isinstance(strategy, HeteroBatchStrategy) and isinstance(strategy.model, DistributedDataParallel):
        exclusion.exclude_buffer_broadcast(strategy.model)
    exclusion.exclude_strategy_collectives(strategy)
    # a CPU quota (CFS) lets a waiting rank look fast: its steps are costed at the quota's rate (`sustained_step_s`)
    return marks, quota_source(trainer.callbacks, busy)
