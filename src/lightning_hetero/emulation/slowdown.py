"""In-process heterogeneity: make chosen ranks slower by a factor, for machines without Docker and for CI.

:class:`SlowdownSchedule` (pure) says which factor a rank has at an epoch or step; :func:`stretch_s` says how long
to sleep; :class:`CfsQuota` (pure) is the accounting of a CFS CPU quota; :class:`SlowdownEmulator` is the
Lightning glue that either stretches each step's compute by sleeping (``throttle="sleep"``) or throttles the rank
like a container with a CPU quota of ``1 / factor`` CPUs (``throttle="cfs"``).

Example::

    >>> schedule = SlowdownSchedule(schedule={0: {1: 2.0}, 10: {1: 4.0}}, unit="step")
    >>> [schedule.factor(rank=1, epoch=0, step=s) for s in (0, 9, 10)], schedule.factor(rank=0, epoch=0, step=10)
    ([2.0, 2.0, 4.0], 1.0)
    >>> stretch_s(factor=3.0, forward_s=0.010, backward_s=0.020)
    0.06
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_hetero._validation import check_range
from lightning_hetero.emulation.device_stretch import DeviceStretch
from lightning_hetero.step_clock import StepClock, step_clock_for

SLOWDOWN_UNITS = ("epoch", "step")
THROTTLE_MODES = ("sleep", "cfs")


class SlowdownSchedule:
    """Slowdown factors per rank, fixed or changing at given epochs or global steps.

    Args:
        factors: ``{rank: factor}`` for the whole run; ranks not named run at full speed (factor 1).
        schedule: ``{start: {rank: factor}}``; each entry holds from its start until the next one (before the first
            start every rank runs at full speed). Give either ``factors`` or ``schedule``.
        unit: what a schedule's starts count: ``"epoch"`` or ``"step"`` (the trainer's global step).
    """

    def __init__(
        self,
        factors: Mapping[int, float] | None = None,
        schedule: Mapping[int, Mapping[int, float]] | None = None,
        unit: str = "epoch",
    ) -> None:
        if (factors is None) == (schedule is None):
            raise ValueError("give exactly one of factors={rank: factor} or schedule={start: {rank: factor}}")
        if unit not in SLOWDOWN_UNITS:
            raise ValueError(f"unit must be one of {', '.join(SLOWDOWN_UNITS)}, got {unit!r}")
        if factors is not None:
            schedule = {0: factors}
        for start, ranks in schedule.items():
            key = "factors" if factors is not None else f"schedule[{start}]"
            check_range("schedule: a start", start, low=0, integer=True)
            for rank, factor in ranks.items():
                check_range(f"{key}: a rank", rank, low=0, integer=True)
                check_range(f"{key}[{rank}] (a slowdown factor)", factor, low=1)
        self.unit = unit
        self.starts = sorted(schedule)
        self.entries = [{rank: float(f) for rank, f in schedule[start].items()} for start in self.starts]

    @property
    def ranks(self) -> set[int]:
        """Every rank the schedule names."""
        return {rank for entry in self.entries for rank in entry}

    def factor(self, rank: int, epoch: int, step: int) -> float:
        position = epoch if self.unit == "epoch" else step
        in_force = [entry for start, entry in zip(self.starts, self.entries, strict=True) if start <= position]
        return in_force[-1].get(rank, 1.0) if in_force else 1.0


def stretch_s(factor: float, forward_s: float, backward_s: float) -> float:
    """Extra seconds that make a step of ``forward_s + backward_s`` compute last ``factor`` times as long."""
    return max(0.0, (factor - 1.0) * (forward_s + backward_s))


class CfsQuota:
    """The Linux CFS bandwidth controller's accounting for one group: ``quota_cpus x period_s`` CPU seconds per period.

    Periods are fixed wall-clock intervals ``[k·period_s, (k+1)·period_s)``. At each period boundary the group's
    budget is refilled by one quota, never above one quota (unused time is lost, as with ``cpu.cfs_quota_us``
    without burst). CPU time used beyond the budget is owed: the group sleeps to the end of the period, and to
    further period ends while the debt exceeds the refills. Time spent blocked (waiting for other ranks) uses no
    budget, so a rank that waits a lot is throttled less often in the steps that follow; only its sustained rate is
    limited to ``quota_cpus`` CPUs.

    Example::

        >>> quota = CfsQuota(quota_cpus=0.25, period_s=0.1)  # 25 ms of CPU per 100 ms
        >>> quota.charge(cpu_s=0.020, now_s=1.000)  # within budget: no throttling
        0.0
        >>> round(quota.charge(cpu_s=0.010, now_s=1.030), 3)  # 30 ms used: sleep to the period's end at 1.1 s
        0.07
        >>> round(quota.remaining_s, 3)  # refilled at 1.1 s, minus the 5 ms owed
        0.02
        >>> round(quota.charge(cpu_s=0.080, now_s=1.150), 3)  # owes 60 ms: three more refills, wake at 1.4 s
        0.25
    """

    def __init__(self, quota_cpus: float, period_s: float = 0.1) -> None:
        check_range("quota_cpus", quota_cpus, low=0, low_open=True)
        check_range("period_s", period_s, low=0, low_open=True)
        self.quota_cpus = quota_cpus
        self.period_s = period_s
        self.remaining_s = self.quota_s
        self._period: int | None = None

    @property
    def quota_s(self) -> float:
        """CPU seconds granted per period."""
        return self.quota_cpus * self.period_s

    def charge(self, cpu_s: float, now_s: float) -> float:
        """Account ``cpu_s`` CPU seconds used up to wall time ``now_s``; return how long to sleep (0 if in budget).

        The state afterwards is that of the moment the sleep ends.
        """
        cpu_s = max(0.0, cpu_s)
        period = math.floor(now_s / self.period_s)
        if self._period is not None and period > self._period:
            # The CPU time was used in the last cpu_s of wall time: what fell before this period's start is paid
            # from the earlier periods' budget (unused budget does not carry over anyway).
            earlier = min(cpu_s, max(0.0, cpu_s - (now_s - period * self.period_s)))
            self.remaining_s -= earlier
            cpu_s -= earlier
            self.remaining_s = min(self.quota_s, self.remaining_s + (period - self._period) * self.quota_s)
        self._period = period if self._period is None else max(self._period, period)
        self.remaining_s -= cpu_s
        if self.remaining_s > 0:
            return 0.0
        refills = math.floor(-self.remaining_s / self.quota_s) + 1
        self.remaining_s = min(self.quota_s, self.remaining_s + refills * self.quota_s)
        self._period += refills
        return max(0.0, self._period * self.period_s - now_s)


class SlowdownEmulator(Callback):
    """Emulates slower machines: a rank with factor ``f`` computes ``f`` times slower, by sleeping or by a CPU quota.

    ``throttle="sleep"`` (default): the extra time is a sleep in ``on_before_backward``, i.e. inside the compute
    window that :class:`~lightning_hetero.measurement.ComputeTimer` measures (batch start to the end of backward),
    and it is proportional to the rank's own compute for that step: the forward time just measured plus the median
    backward time of recent steps (measured with gradient-accumulation hooks, so waiting for other ranks in DDP's
    all-reduce is never counted). A slowed rank's samples per second therefore drop by ``f``, and its step time
    grows with its batch size as a slower machine's would.

    ``throttle="cfs"``: the rank behaves like a container with ``--cpus 1/f`` under Linux's CFS bandwidth control
    (:class:`CfsQuota`): it may use ``period_ms / f`` ms of CPU time (all of its threads, ``time.process_time``)
    per ``period_ms`` of wall time and then sleeps to the period's end. Its CPU use is charged before and after each
    module's forward, when backward reaches each module's output, after backward and at the batch's start and end,
    so a throttle can land anywhere in a step, including outside the compute window, but never inside a collective
    (real CFS can throttle there too); time spent blocked waiting for other ranks uses no quota. Its step times
    therefore jump in period-sized steps and only its *sustained* rate is ``1/f`` of a CPU: this reproduces the
    failure modes of real quotas (quantised, bursty step times) in process and deterministically enough for CI.

    Args:
        factors: ``{rank: factor}`` for the whole run (factors >= 1; unnamed ranks are not slowed).
        schedule: ``{start: {rank: factor}}`` changing at epochs or steps; give this or ``factors``.
        unit: ``"epoch"`` or ``"step"``, what the schedule's starts count.
        backward_window: recent backward timings whose median stands in for this step's backward (sleep mode).
        throttle: ``"sleep"`` or ``"cfs"``, as above.
        period_ms: the CFS period in milliseconds (Docker's default is 100); used with ``throttle="cfs"``.
        cpu_clock: the clock whose advance is charged to the quota (``throttle="cfs"``); default
            ``time.process_time``. A benchmark whose "compute" is partly emulated by sleeping can add the emulated
            seconds to it, so that throttling does not depend on how busy the host is.

    Example::

        >>> from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule
        >>> trainer = L.Trainer(max_epochs=1, callbacks=[SlowdownEmulator(factors={0: 1.5})], logger=False,
        ...                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        >>> trainer.fit(MLPClassifier(), datamodule=SyntheticClassificationDataModule(num_samples=64))
        >>> trainer.global_step
        2

    Notes:
        This *emulates* a slower machine by stretching time; it does not limit the CPU for other processes. The
        sleeping rank frees its core (other ranks on the same host are not slowed, unlike with a real CPU quota),
        and it has no cache, memory-bandwidth or thermal effects. In sleep mode data loading and the optimizer step
        are not slowed, only compute between batch start and the end of backward is stretched, and the backward
        share is estimated from earlier steps, so the first step of a run is not stretched. In CFS mode the CPU
        time used between two charge points runs unthrottled before it is paid for (a chunk's worth of error) and
        DataLoader worker processes are not charged.
        For real throttling use the Docker companion (``lightning-hetero emulate``).
    """

    def __init__(
        self,
        factors: Mapping[int, float] | None = None,
        schedule: Mapping[int, Mapping[int, float]] | None = None,
        unit: str = "epoch",
        backward_window: int = 5,
        throttle: str = "sleep",
        period_ms: float = 100.0,
        cpu_clock: Callable[[], float] = time.process_time,
    ) -> None:
        check_range("backward_window", backward_window, low=1, integer=True)
        if throttle not in THROTTLE_MODES:
            raise ValueError(f"throttle must be one of {', '.join(THROTTLE_MODES)}, got {throttle!r}")
        check_range("period_ms", period_ms, low=0, low_open=True)
        self.schedule = SlowdownSchedule(factors, schedule, unit)
        self.throttle = throttle
        self.period_ms = float(period_ms)
        self.cpu_clock = cpu_clock
        self._backward_s: deque[float] = deque(maxlen=backward_window)
        self._segment_start = 0.0
        self._backward_start: float | None = None
        self._last_grad = 0.0
        self._handles: list[Any] = []
        self._quota: CfsQuota | None = None
        self._factor = 1.0
        self._cpu_s = 0.0
        #: seconds slept in the current (or last) batch; the emulator's own account, for logging and tests
        self.batch_stretch_s = 0.0
        #: seconds slept since fit started
        self.total_stretch_s = 0.0
        #: sleep mode on CUDA: the device clock the stretch is queued on (set at fit start; a test may set a fake)
        self.device_clock: StepClock | None = None
        self._device: DeviceStretch | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        beyond = sorted(rank for rank in self.schedule.ranks if rank >= trainer.world_size)
        if beyond:
            raise ValueError(f"SlowdownEmulator: ranks {beyond} named, but the world size is {trainer.world_size}")
        if stage == "fit":
            self._handles = [
                p.register_post_accumulate_grad_hook(self._on_grad_ready)
                for p in pl_module.parameters()
                if p.requires_grad
            ]
            if self.throttle == "cfs":
                self._cpu_s = self.cpu_clock()  # CPU used before fit (imports, set-up) is not charged
                for module in pl_module.modules():
                    self._handles.append(module.register_forward_pre_hook(lambda *_: self._charge()))
                    self._handles.append(module.register_forward_hook(self._charge_forward_and_backward))
            entries = ", ".join(
                f"{self.schedule.unit} {start}: "
                + (", ".join(f"rank {r} x{f:g}" for r, f in sorted(entry.items())) or "none")
                for start, entry in zip(self.schedule.starts, self.schedule.entries, strict=True)
            )
            how = "sleeps" if self.throttle == "sleep" else f"CFS quota of 1/factor CPUs per {self.period_ms:g} ms"
            rank_zero_info(f"SlowdownEmulator ({how} emulate slower ranks): {entries}")

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.throttle == "sleep" and self.device_clock is None and pl_module.device.type == "cuda":
            self.device_clock = step_clock_for(pl_module.device)  # a host sleep would only delay kernel launches
        self._device = None if self.device_clock is None else DeviceStretch(self.device_clock)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._charge()
        self._segment_start = time.perf_counter()
        self.batch_stretch_s = 0.0
        self._factor = self.schedule.factor(trainer.global_rank, trainer.current_epoch, trainer.global_step)
        if self._device is not None:
            self._device.batch_start()
        if self.throttle == "cfs":
            if self._factor <= 1.0:
                self._quota = None
            elif self._quota is None:
                self._quota = CfsQuota(1.0 / self._factor, self.period_ms / 1000.0)
            else:
                self._quota.quota_cpus = 1.0 / self._factor
                self._quota.remaining_s = min(self._quota.remaining_s, self._quota.quota_s)

    @override
    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        if self._device is not None:  # stretched on the device's queue; the step's compute ends with its backward
            self._device.before_backward(self._factor)
            if loss.requires_grad:
                queue = torch.autograd.Variable._execution_engine.queue_callback  # type: ignore[attr-defined]
                loss.register_hook(lambda grad, end=self._device.compute_end: queue(end))  # type: ignore[misc]
            return
        forward_s = time.perf_counter() - self._segment_start
        # The first step of a run pays one-off costs (lazy initialisation, first collectives: up to a second under
        # AsyncPSStrategy) that a slower machine would not multiply; stretching starts once a backward is measured.
        if self.throttle == "sleep" and self._factor > 1.0 and self._backward_s:
            backward_s = statistics.median(self._backward_s)
            self._sleep(stretch_s(self._factor, forward_s, backward_s))
        self._backward_start = time.perf_counter()

    @override
    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._charge()
        if self._backward_start is not None and self._last_grad > self._backward_start:
            self._backward_s.append(self._last_grad - self._backward_start)
        self._backward_start = None
        # a further backward in this batch (manual optimization) stretches only the compute after this one
        self._segment_start = time.perf_counter()

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._charge()

    @property
    def emulates_cpu_quota(self) -> bool:
        """Whether this emulator throttles by a CPU quota (``throttle="cfs"``; see
        :class:`~lightning_hetero.contracts.CpuQuotaClock`)."""
        return self.throttle == "cfs"

    @property
    def cpu_quota(self) -> float | None:
        """This rank's emulated CPU quota in CPUs for the current step (``None``: not throttled by a quota)."""
        if self.throttle != "cfs" or self._factor <= 1.0:
            return None
        return 1.0 / self._factor

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        self._last_grad = time.perf_counter()

    def _charge_forward_and_backward(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        self._charge()
        # Charge again when backward reaches this module's output: during backward, before the module's own
        # gradients (and so before DDP hands the last gradient bucket to the all-reduce), never inside a collective.
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad: self._charge())

    def _charge(self) -> None:
        """CFS mode: pay for the CPU time used since the last charge point, sleeping when the quota is spent."""
        if self.throttle != "cfs":
            return
        cpu_s = self.cpu_clock()
        used, self._cpu_s = cpu_s - self._cpu_s, cpu_s
        if self._quota is not None:
            self._sleep(self._quota.charge(used, time.monotonic()))

    def _sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        slept_from = time.perf_counter()
        time.sleep(seconds)
        slept = time.perf_counter() - slept_from
        self.batch_stretch_s += slept
        self.total_stretch_s += slept
