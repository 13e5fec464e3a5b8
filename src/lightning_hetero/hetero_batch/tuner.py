"""HeteroBatch's tuner: one object that turns measured steps into split decisions, with no Trainer in it.

The callback feeds it each finished step (:meth:`SplitTuner.record_step`), sends the row it returns at the end of
an adjustment period (:meth:`SplitTuner.close_period`) through one all-gather and hands back what every rank read
(:meth:`SplitTuner.adjust`), which decides the split, keeps it within every rank's memory cap (:func:`respect_caps`)
and puts it in force at a step every rank agrees on. Built from the callback's read-only settings
(:meth:`SplitTuner.from_settings`), the tuner owns the period's measurements
(:class:`~lightning_hetero.hetero_batch.period.MeasuredPeriod`), this rank's cost model
(:class:`~lightning_hetero.hetero_batch.cost_model.PeriodCostModel`), the adjustment policy and its controller,
and the split plan the sampler reads; its :meth:`~SplitTuner.state_dict` is the callback's checkpoint state. Its
logged metrics and end-of-fit summary are :func:`adjustment_metrics` and :func:`format_summary`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info

from lightning_hetero.allocation import line_times_s
from lightning_hetero.hetero_batch.batches import SplitPlan
from lightning_hetero.hetero_batch.controller import BatchSizeController, Decision
from lightning_hetero.hetero_batch.cost_model import PeriodCostModel
from lightning_hetero.hetero_batch.period import (
    EARLY_PERIOD,
    Exchanged,
    MeasuredPeriod,
    adjusts_after,
    describe,
    own_row,
    trimmed,
)
from lightning_hetero.hetero_batch.policy import AdjustmentPolicy
from lightning_hetero.hetero_batch.settings import (
    HeteroBatchSettings,
    raised_min_batch_size,
    resolve_batch_size_multiple,
)

log = logging.getLogger("lightning_hetero.hetero_batch")


class SplitTuner:
    """Measured periods in, split decisions out: every rank's tuner reads the same exchange and decides alike.

    Args:
        controller: the bounds, the global batch and the deadband.
        rank: this rank (whose steps :meth:`record_step` receives).
        start: the split to start from (default: the controller's equal split).
        rollback_tolerance: passed to :class:`~lightning_hetero.hetero_batch.policy.AdjustmentPolicy`.
        change_tolerance: passed to :class:`~lightning_hetero.hetero_batch.cost_model.PeriodCostModel` and the policy.
        warmup_steps: steps not measured at the start.
        respects_memory_caps: keep every split within the ranks' exchanged memory caps (``memory_caps="auto"``).
        adjust_every_n_steps: adjust every ``n`` steps inside an epoch; ``None``: the default cadence
            (:func:`~lightning_hetero.hetero_batch.period.adjusts_after`).

    Example::

        >>> from lightning_hetero.hetero_batch.period import read_rows
        >>> tuners = [SplitTuner(BatchSizeController(global_batch_size=64, world_size=2), rank=r) for r in (0, 1)]
        >>> for _ in range(6):  # rank 1 is three times slower per sample; the step waits for it
        ...     for rank, tuner in enumerate(tuners):
        ...         tuner.record_step((32, 32), busy_s=0.001 * 32 * (3 if rank else 1), floor_s=0.0, wall_s=0.1)
        >>> seen = read_rows(torch.stack([tuner.close_period(position=6) for tuner in tuners]))
        >>> decisions = [tuner.adjust(seen, step=6, epoch=0) for tuner in tuners]
        >>> decisions[0].sizes, decisions[0].reason, decisions[0] == decisions[1]
        ((48, 16), 'balance', True)
        >>> tuners[1].split, tuners[1].plan.split_at(6), tuners[1].history[0]["to"]  # in force after the position
        ((48, 16), (32, 32), (48, 16))
    """

    def __init__(
        self,
        controller: BatchSizeController,
        rank: int,
        start: Sequence[int] | None = None,
        rollback_tolerance: float = 0.15,
        change_tolerance: float = 0.4,
        warmup_steps: int = 0,
        respects_memory_caps: bool = False,
        adjust_every_n_steps: int | None = None,
    ) -> None:
        self.controller = controller
        self.rank = rank
        self.respects_memory_caps = respects_memory_caps
        self.adjust_every_n_steps, self.warmup_steps = adjust_every_n_steps, warmup_steps
        self._first_epoch: int | None = None  # a new tuner's first epoch adjusts early too (not a restored one)
        self.policy = AdjustmentPolicy(
            controller, rollback_tolerance=rollback_tolerance, change_tolerance=change_tolerance
        )
        self.cost = PeriodCostModel(change_tolerance=change_tolerance)
        self.period = MeasuredPeriod(skip=warmup_steps)
        self.plan = SplitPlan(controller.equal_split() if start is None else start)
        #: every rank's (overhead_s, per_sample_s) at the last exchange
        self.costs: tuple[tuple[float, float], ...] | None = None
        #: every rank's mean busy seconds per step at its current batch size, at the last exchange
        self.busy_s: tuple[float, ...] | None = None
        #: the synchronous step (wall seconds per step at the current split) measured in the last period
        self.sync_step_s: float | None = None
        #: every rank's samples per second at the split measured, from the last fits
        self.throughputs: tuple[float, ...] | None = None
        #: one entry per applied change of split
        self.history: list[dict[str, Any]] = []
        self._period_walls: list[float] = []
        self._changed = False
        self._since_change = 0  # steps since the last adjustment

    @classmethod
    def from_settings(
        cls, settings: HeteroBatchSettings, global_batch: int, rank: int, world_size: int, device: str, floor: int = 1
    ) -> SplitTuner:
        """The tuner for the callback's ``settings``, printing the batch-size multiple chosen; ``floor`` is the samples
        a rank needs per step (2 with BatchNorm, :func:`~lightning_hetero.hetero_batch.settings.model_floor`).

        Example::

            >>> from lightning_hetero.hetero_batch import HeteroBatchSettings
            >>> SplitTuner.from_settings(HeteroBatchSettings(), global_batch=64, rank=0, world_size=2, device="cpu").split
            (32, 32)
        """
        initial = settings.initial_batch_sizes
        if initial is not None and sum(initial) != global_batch:
            raise ValueError(f"initial_batch_sizes sum to {sum(initial)}, not the global batch {global_batch}")
        multiple, why = resolve_batch_size_multiple(settings.batch_size_multiple, device, global_batch, world_size)
        rank_zero_info(f"HeteroBatchCallback: per-rank batch sizes in multiples of {multiple} ({why})")
        advanced, auto_caps = settings.advanced, settings.memory_caps == "auto"
        controller = BatchSizeController(
            global_batch,
            world_size,
            min_batch_size=raised_min_batch_size(settings.min_batch_size, floor),
            max_batch_size=settings.max_batch_size,
            memory_caps=None if auto_caps else settings.memory_caps,  # type: ignore[arg-type]
            deadband=advanced.deadband,
            batch_size_multiple=multiple,
        )
        return cls(
            controller,
            rank,
            start=initial,
            rollback_tolerance=advanced.rollback_tolerance,
            change_tolerance=advanced.change_tolerance,
            warmup_steps=advanced.warmup_steps,
            respects_memory_caps=auto_caps,
            adjust_every_n_steps=settings.adjust_every_n_steps,
        )

    @property
    def split(self) -> tuple[int, ...]:
        """The newest split, one size per rank."""
        return self.plan.current

    def start_fit(self, epoch: int, steps_in_epoch: int, lock_step: bool) -> str:
        """A fit starts at ``epoch`` with epochs of ``steps_in_epoch`` steps: a tuner with no fits yet adjusts early in
        it too. Returns the cadence it follows, in words (:func:`~lightning_hetero.hetero_batch.period.describe`);
        ``lock_step``: the strategy's ranks step together inside an epoch."""
        self._first_epoch = epoch if self.costs is None else None
        first = self._first_epoch is not None
        return describe(steps_in_epoch, self.adjust_every_n_steps, self.warmup_steps, first, lock_step)

    def adjusts_after(self, step: int, steps_in_epoch: int, epoch: int) -> bool:
        """Whether to adjust after the ``step``-th step (from 1) of ``epoch``, short of its end (which always adjusts;
        :func:`~lightning_hetero.hetero_batch.period.adjusts_after`). Asked once after every step, on every rank:
        with the default cadence a change on trial is also judged :data:`~.period.EARLY_PERIOD` steps after it was
        decided, so that a split measured slower runs a few steps, not a period of 32."""
        first = epoch == self._first_epoch
        self._since_change += 1
        judge = self.adjust_every_n_steps is None and self.policy.on_trial and self._since_change >= EARLY_PERIOD
        return (step < steps_in_epoch and judge) or adjusts_after(
            step, steps_in_epoch, self.adjust_every_n_steps, self.warmup_steps, first
        )

    def record_step(self, split: tuple[int, ...], busy_s: float, floor_s: float, wall_s: float) -> None:
        """One finished step taken at ``split``: this rank's busy seconds, its CPU-at-quota floor and wall seconds."""
        self.period.record(split, self.rank, busy_s, floor_s, wall_s)

    def skip_next(self) -> None:
        """Do not measure the next step (the first at a new split pays for it)."""
        self.period.skip_next()

    def close_period(self, position: int, memory_cap: int | None = None) -> torch.Tensor:
        """End the period: fold its steps into the cost model and return this rank's row for the exchange
        (:func:`~lightning_hetero.hetero_batch.period.own_row`); ``position`` is how far this rank's loader got,
        ``memory_cap`` its largest batch known to fit (``memory_caps="auto"``)."""
        current, cost = self.plan.current, self.cost
        steps, busy_s, self._period_walls = self.period.close(current, self.rank)
        self._changed = cost.update(steps).changed
        return own_row(
            (cost.overhead_s, cost.per_sample_s, len(cost.sizes)),
            cost.latest_fit(),
            self._changed,
            position,
            busy_s,
            trimmed(self.period.sync_walls),
            trimmed(self._period_walls),
            cost.relative_error(current[self.rank]),
            memory_cap,
            self.period.wait_s,
        )

    def adjust(self, seen: Exchanged, step: int, epoch: int, not_before: int = 0) -> Decision | None:
        """Decide from what every rank read from the exchange (``None`` while some rank has no fit yet) and put an
        applied split in force in :attr:`plan` at the first step no rank's loader has produced yet, and not before
        position ``not_before`` (an adjustment at an epoch's end: the next epoch's first step, so that the epoch's
        remaining prefetched batches keep their split).

        A decision of the policy that applies is recorded in :attr:`history` (at the trainer's ``step`` and
        ``epoch``). With :attr:`respects_memory_caps`, every rank splits within every rank's exchanged cap
        (:func:`respect_caps`).
        """
        decision = self._decide(seen, step, epoch)
        if self.respects_memory_caps:
            caps = tuple(None if not math.isfinite(cap) else int(cap) for cap in seen.memory_caps)
            decision = respect_caps(decision, self.plan.current, self.controller, caps)
        self._since_change = 0
        if decision is not None and decision.apply:
            self.plan.change_at(max(seen.position + 1, not_before), decision.sizes)
        return decision

    def _decide(self, seen: Exchanged, step: int, epoch: int) -> Decision | None:
        current = self.plan.current
        if any(seen.changed):
            # a rank saw its speed change: every rank restarts from the same (newest) period
            self.period.restart_sync(current, self._period_walls)
            if not self._changed:
                self.cost.restart_from_latest()
        if seen.costs is None:
            return None
        self.costs, self.sync_step_s = seen.costs, seen.sync_step_s
        if all(math.isfinite(b) for b in seen.busy_s):
            self.busy_s = seen.busy_s
        self.throughputs = tuple(b / t for b, t in zip(current, line_times_s(current, self.costs), strict=True))
        decision = self.policy.decide(
            current,
            self.costs,
            self.sync_step_s,
            known_sizes=seen.known_sizes,
            sync_steps=seen.sync_steps,
            relative_errors=seen.relative_errors,
            speeds_changed=any(seen.changed),
            busy_s=seen.busy_s,
            wait_s=min(seen.waits_s, default=math.nan),
        )
        if decision.apply:
            self.history.append(
                {
                    "step": step,
                    "epoch": epoch,
                    "from": current,
                    "to": decision.sizes,
                    "reason": decision.reason,
                    "costs": self.costs,
                    "sync_step_s": self.sync_step_s,
                    "changed": list(seen.changed),
                }
            )
        return decision

    def predicted_step_s(self, split: Sequence[int] | None = None) -> tuple[float, ...]:
        """Each rank's predicted busy seconds per step at ``split`` (default: the current one), from the last fits."""
        if self.costs is None:
            return ()
        return line_times_s(self.plan.current if split is None else split, self.costs)

    def summary(self) -> str:
        """A one-screen table (see :func:`~lightning_hetero.hetero_batch.tuner.format_summary`)."""
        predicted = self.predicted_step_s()
        equal = self.predicted_step_s(self.controller.equal_split()) if predicted else None
        return format_summary(self.plan.current, predicted, self.busy_s, self.history, self.sync_step_s, equal)

    def state_dict(self) -> dict[str, Any]:
        """The split in force, every rank's fit and throughput, the policy's state and the history.

        Lightning saves rank 0's callback state only, so it holds what every rank knows alike: each rank's cost model
        resumes from its own fit in ``costs`` (its per-size means are its own and start again).
        """
        return {
            "split": list(self.plan.current),
            "throughputs": None if self.throughputs is None else list(self.throughputs),
            "costs": None if self.costs is None else [list(c) for c in self.costs],
            "policy": self.policy.state_dict(),
            "history": self.history,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (also a checkpoint of the release before the tuner, same keys).

        Raises:
            ValueError: the saved split does not fit this run's ranks or global batch.
        """
        self.history = list(state.get("history", []))
        if not state.get("split"):
            return
        split = tuple(state["split"])
        world_size, global_batch = self.controller.world_size, self.controller.global_batch_size
        if len(split) != world_size or sum(split) != global_batch:
            raise ValueError(
                f"the checkpoint's split {split} does not fit this run ({world_size} ranks, global batch "
                f"{global_batch}); resume with the same devices and batch size"
            )
        self.plan = SplitPlan(split)
        if state.get("throughputs"):
            self.throughputs = tuple(state["throughputs"])
        if state.get("costs"):
            self.costs = tuple((a, c) for a, c in state["costs"])
            overhead_s, per_sample_s = self.costs[self.rank]
            self.cost.load_state_dict({"overhead_s": overhead_s, "per_sample_s": per_sample_s})
        if state.get("policy"):
            self.policy.load_state_dict(state["policy"])


def format_summary(
    sizes: Sequence[int],
    predicted_s: Sequence[float],
    measured_s: Sequence[float] | None,
    history: Sequence[dict[str, Any]],
    sync_step_s: float | None,
    equal_split_predicted_s: Sequence[float] | None,
) -> str:
    """A one-screen table; ``predicted_s`` may be empty (no fit yet), ``measured_s`` ``None`` (no exchange yet).

    Example::

        >>> print(format_summary([48, 16], [0.0301, 0.0299], [0.030, 0.031], [{"reason": "balance"}], 0.0312,
        ...                      [0.020, 0.058]))
        HeteroBatchCallback summary
        rank batch size  predicted busy ms/step  measured busy ms/step
           0         48                    30.1                   30.0
           1         16                    29.9                   31.0
        global batch 64, split changes 1 (0 rolled back)
        measured synchronous step at the split in force: 31.2 ms
        predicted step-time ratio, equal batches / this split (model): 1.93
    """
    header = f"{'rank':>4} {'batch size':>10} {'predicted busy ms/step':>23} {'measured busy ms/step':>22}"
    lines = ["HeteroBatchCallback summary", header]
    for rank, size in enumerate(sizes):
        guess = f"{1e3 * predicted_s[rank]:23.1f}" if predicted_s else f"{'n/a':>23}"
        seen = measured_s[rank] if measured_s else math.nan
        measured = f"{1e3 * seen:22.1f}" if math.isfinite(seen) else f"{'n/a':>22}"
        lines.append(f"{rank:>4} {size:>10} {guess} {measured}")
    rollbacks = sum(1 for change in history if change.get("reason") == "rollback")
    lines.append(f"global batch {sum(sizes)}, split changes {len(history)} ({rollbacks} rolled back)")
    if sync_step_s is not None:
        lines.append(f"measured synchronous step at the split in force: {1e3 * sync_step_s:.1f} ms")
    if predicted_s and equal_split_predicted_s:
        ratio = max(equal_split_predicted_s) / max(predicted_s)
        lines.append(f"predicted step-time ratio, equal batches / this split (model): {ratio:.2f}")
    return "\n".join(lines)


def adjustment_metrics(
    predicted_s: Sequence[float], sync_step_s: float | None, sizes: Sequence[int]
) -> dict[str, float]:
    """What HeteroBatch logs at each adjustment: per-rank predicted busy ms per step and batch size, and the measured
    synchronous step.

    Example::

        >>> adjustment_metrics([0.03, 0.031], 0.0312, [48, 16])["hetero/sync_step_ms"]
        31.2
    """
    metrics = {f"hetero/predicted_step_ms_rank{k}": 1e3 * t for k, t in enumerate(predicted_s)}
    if sync_step_s is not None:
        metrics["hetero/sync_step_ms"] = 1e3 * sync_step_s
    return metrics | {f"hetero/batch_size_rank{k}": float(b) for k, b in enumerate(sizes)}


def respect_caps(
    decision: Decision | None, current: Sequence[int], controller: BatchSizeController, caps: Sequence[int | None]
) -> Decision | None:
    """Put ``caps`` into ``controller``'s upper bounds; if the split in force (or the one decided) exceeds one,
    return the nearest split within them instead (reason ``"memory"``). Caps that cannot hold the global batch
    together are left out of the bounds (a warning says so): ranks over their cap then run in chunks.

    Example::

        >>> controller = BatchSizeController(global_batch_size=64, world_size=2)
        >>> respect_caps(None, [32, 32], controller, [None, 20])
        Decision(sizes=(44, 20), predicted_gain=0.0, apply=True, reason='memory')
    """
    upper = [hi if cap is None else min(hi, cap) for hi, cap in zip(controller.upper, caps, strict=True)]
    if sum(upper) < controller.global_batch_size:
        log.warning(
            f"memory_caps='auto': the ranks' batches that fit in memory {upper} do not hold the global batch "
            f"({controller.global_batch_size}); ranks over their cap run their batches in chunks"
        )
        return decision
    controller.upper = upper
    lower = [min(lo, hi) for lo, hi in zip(controller.lower, upper, strict=True)]
    controller.lower = lower
    sizes = tuple(current) if decision is None or not decision.apply else decision.sizes
    if all(b <= hi for b, hi in zip(sizes, upper, strict=True)):
        return decision
    within = controller.propose([float(b) for b in sizes])  # in proportion, in multiples of batch_size_multiple
    return Decision(within, 0.0, apply=True, reason="memory")
