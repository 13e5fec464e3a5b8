"""In-process heterogeneity: make chosen ranks slower by a factor, for machines without Docker and for CI.

:class:`SlowdownSchedule` (pure) says which factor a rank has at an epoch or step; :func:`stretch_s` says how long
to sleep; :class:`SlowdownEmulator` is the Lightning glue that measures each step's compute and sleeps.

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
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

SLOWDOWN_UNITS = ("epoch", "step")


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
            if isinstance(start, bool) or not isinstance(start, int) or start < 0:
                raise ValueError(f"schedule: starts must be integers >= 0, got {start!r}")
            for rank, factor in ranks.items():
                if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
                    raise ValueError(f"{key}: ranks must be integers >= 0, got {rank!r}")
                if not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor < 1:
                    raise ValueError(f"{key}[{rank}]: a slowdown factor must be a finite number >= 1, got {factor!r}")
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


class SlowdownEmulator(Callback):
    """Emulates slower machines: a rank with factor ``f`` takes ``f`` times as long to compute each step.

    The extra time is a sleep in ``on_before_backward``, i.e. inside the compute window that
    :class:`~lightning_hetero.measurement.ComputeTimer` measures (batch start to the end of backward), and it is
    proportional to the rank's own compute for that step: the forward time just measured plus the median backward
    time of recent steps (measured with gradient-accumulation hooks, so waiting for other ranks in DDP's all-reduce
    is never counted). A slowed rank's samples per second therefore drop by ``f``, and its step time grows with its
    batch size as a slower machine's would.

    Args:
        factors: ``{rank: factor}`` for the whole run (factors >= 1; unnamed ranks are not slowed).
        schedule: ``{start: {rank: factor}}`` changing at epochs or steps; give this or ``factors``.
        unit: ``"epoch"`` or ``"step"``, what the schedule's starts count.
        backward_window: recent backward timings whose median stands in for this step's backward.

    Example::

        >>> from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule
        >>> trainer = L.Trainer(max_epochs=1, callbacks=[SlowdownEmulator(factors={0: 1.5})], logger=False,
        ...                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        >>> trainer.fit(MLPClassifier(), datamodule=SyntheticClassificationDataModule(num_samples=64))
        >>> trainer.global_step
        2

    Notes:
        This *emulates* a slower machine by stretching time; it does not throttle the CPU. The sleeping rank frees
        its core (other ranks on the same host are not slowed, unlike with a real CPU quota), it has no cache,
        memory-bandwidth or thermal effects, data loading and the optimizer step are not slowed, and only compute
        between batch start and the end of backward is stretched. The backward share is estimated from earlier
        steps, so the first step of a run is not stretched, and a step right after the model changes is stretched
        less exactly.
        For real throttling use the Docker companion (``lightning-hetero emulate``).
    """

    def __init__(
        self,
        factors: Mapping[int, float] | None = None,
        schedule: Mapping[int, Mapping[int, float]] | None = None,
        unit: str = "epoch",
        backward_window: int = 5,
    ) -> None:
        if backward_window < 1:
            raise ValueError(f"backward_window must be >= 1, got {backward_window}")
        self.schedule = SlowdownSchedule(factors, schedule, unit)
        self._backward_s: deque[float] = deque(maxlen=backward_window)
        self._segment_start = 0.0
        self._backward_start: float | None = None
        self._last_grad = 0.0
        self._handles: list[Any] = []
        #: seconds slept in the current (or last) batch; the emulator's own account, for logging and tests
        self.batch_stretch_s = 0.0

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
            entries = ", ".join(
                f"{self.schedule.unit} {start}: "
                + (", ".join(f"rank {r} x{f:g}" for r, f in sorted(entry.items())) or "none")
                for start, entry in zip(self.schedule.starts, self.schedule.entries, strict=True)
            )
            rank_zero_info(f"SlowdownEmulator (sleeps emulate slower ranks): {entries}")

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._segment_start = time.perf_counter()
        self.batch_stretch_s = 0.0

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        forward_s = time.perf_counter() - self._segment_start
        factor = self.schedule.factor(trainer.global_rank, trainer.current_epoch, trainer.global_step)
        # The first step of a run pays one-off costs (lazy initialisation, first collectives: up to a second under
        # AsyncPSStrategy) that a slower machine would not multiply; stretching starts once a backward is measured.
        if factor > 1.0 and self._backward_s:
            backward_s = statistics.median(self._backward_s)
            slept_from = time.perf_counter()
            time.sleep(stretch_s(factor, forward_s, backward_s))
            self.batch_stretch_s += time.perf_counter() - slept_from
        self._backward_start = time.perf_counter()

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._backward_start is not None and self._last_grad > self._backward_start:
            self._backward_s.append(self._last_grad - self._backward_start)
        self._backward_start = None
        # a further backward in this batch (manual optimization) stretches only the compute after this one
        self._segment_start = time.perf_counter()

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        self._last_grad = time.perf_counter()
