"""HeteroBatch's adjustment period: when one ends (the cadence), the steps a rank measured in it, and the one
exchange at its end.

**Cadence.** HeteroBatch adjusts every ``adjust_every_n_steps`` steps if set; by default early in the first epoch, so
that the first split is measured and corrected before the epoch ends, and every :data:`STEADY_PERIOD` steps inside
every epoch, so that a speed change inside a long epoch is followed before its end. Why early: an adjustment fits
each rank's cost (a fixed overhead plus a per-sample cost) on the batch sizes it has run. The first one has seen one
split only, so it cannot tell a rank's overhead from its per-sample cost and lands a few samples short of the best
split (measured under Docker CPU quotas: 104/24 where the best is 106/22 of 128, the epoch at the short split running
at 0.94 of the next). With adjustments at epoch ends only, the second fit came an epoch later; adjusting early inside
the first epoch puts both fits there, and later epochs start at the refined split.

**Measured steps** (:class:`MeasuredPeriod`): pure bookkeeping between the per-step hook and the adjustment: which
steps count (not the warm-up, not the first step at a new split, which pays for it in allocator and caches), what
the cost model is fed, the rank's mean busy time at its current size, and the synchronous step's wall times kept
across periods while the split stays (up to 32 steps: a change lands a step or two into a period, so one period can
be too few steps to judge it).

**Exchange.** Each rank sends one float64 row (:func:`own_row`); after one ``all_gather`` every rank reads the same
:class:`Exchanged` from the stacked rows (:func:`read_rows`) and so takes the same decision. A row carries both the
rank's fit as it stands and its fit restarted from the newest period, so that when any rank saw its speed change
all ranks restart together without a second exchange.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy

from lightning_hetero._validation import check_range
from lightning_hetero.contracts import HeteroBatchStrategy
from lightning_hetero.measurement import BusyTimer

#: the most steps an early adjustment measures before it adjusts (also the adjustment period bench_controller checks)
EARLY_PERIOD = 8
#: the fewest measured steps an early adjustment rests on (the first at a new split is not measured)
EARLY_MIN_PERIOD = 4
#: early adjustments in the first epoch at most (the epoch's end adjusts too)
EARLY_ADJUSTMENTS = 2
#: by default, steps between adjustments inside every epoch (as many as a split's synchronous steps are kept:
#: :data:`SYNC_STEPS_KEPT`); an epoch of at most this many steps adjusts at its end only
STEADY_PERIOD = 32


def early_steps(steps_in_epoch: int, warmup_steps: int) -> tuple[int, ...]:
    """The steps of the first epoch after which HeteroBatch adjusts by default (counted from 1).

    Each early adjustment measures ``period`` steps, at most :data:`EARLY_PERIOD` and at most half of the epoch's
    steps after the warm-up, and leaves at least ``period`` steps before the epoch's end for the split it chose to be
    measured; an epoch too short for a period of :data:`EARLY_MIN_PERIOD` steps adjusts at its end only.

    Example::

        >>> early_steps(16, warmup_steps=3)  # 6 steps at the first split, 7 at the second before the epoch's end
        (9,)
        >>> early_steps(100, warmup_steps=3)
        (11, 19)
        >>> early_steps(10, warmup_steps=3)  # 7 steps after the warm-up: too few for two periods of 4
        ()
    """
    check_range("steps_in_epoch", steps_in_epoch, low=0, integer=True)
    check_range("warmup_steps", warmup_steps, low=0, integer=True)
    period = min(EARLY_PERIOD, (steps_in_epoch - warmup_steps) // 2)
    if period < EARLY_MIN_PERIOD:
        return ()
    steps = (warmup_steps + k * period for k in range(1, EARLY_ADJUSTMENTS + 1))
    return tuple(step for step in steps if step <= steps_in_epoch - period)


def adjusts_after(step: int, steps_in_epoch: int, every: int | None, warmup_steps: int, first_epoch: bool) -> bool:
    """Whether HeteroBatch adjusts after the epoch's ``step``-th step (from 1), short of the epoch's end (which
    always adjusts): every ``every`` steps when set, else at :func:`early_steps` in the first epoch and every
    :data:`STEADY_PERIOD` steps in every epoch.

    Example::

        >>> [s for s in range(1, 17) if adjusts_after(s, 16, every=None, warmup_steps=3, first_epoch=True)]
        [9]
        >>> [s for s in range(1, 17) if adjusts_after(s, 16, every=None, warmup_steps=3, first_epoch=False)]
        []
        >>> [s for s in range(1, 101) if adjusts_after(s, 100, every=None, warmup_steps=3, first_epoch=True)]
        [11, 19, 32, 64, 96]
        >>> [s for s in range(1, 101) if adjusts_after(s, 100, every=None, warmup_steps=3, first_epoch=False)]
        [32, 64, 96]
        >>> [s for s in range(1, 17) if adjusts_after(s, 16, every=4, warmup_steps=3, first_epoch=False)]
        [4, 8, 12]
    """
    if step >= steps_in_epoch:
        return False
    if every is not None:
        return step % every == 0
    return step % STEADY_PERIOD == 0 or (first_epoch and step in early_steps(steps_in_epoch, warmup_steps))


def in_lock_step(strategy: object) -> bool:
    """Whether the strategy's ranks step together inside an epoch: ranks of an asynchronous strategy
    (``AsyncPSStrategy`` in ASP) do not, and an exchange of measurements there would make fast ranks wait, so the split
    changes only at epoch ends.

    Example::

        >>> in_lock_step(object())  # DDP, FSDP, one device
        True
    """
    return not isinstance(strategy, HeteroBatchStrategy) or strategy.in_lock_step


def describe(steps_in_epoch: int, every: int | None, warmup_steps: int, first_epoch: bool, lock_step: bool) -> str:
    """When HeteroBatch adjusts, and why, as the line it prints at the start of a fit: what :func:`adjusts_after`
    does for epochs of ``steps_in_epoch`` steps; ``lock_step``: the strategy's ranks step together inside an epoch
    (``AsyncPSStrategy`` in ASP does not, so there the split changes at epoch ends only).

    Example::

        >>> describe(100, every=None, warmup_steps=3, first_epoch=True, lock_step=True)
        "at every epoch's end, after steps 11 and 19 of this first epoch (to measure its first splits early), and every 32 steps inside epochs of 100 steps (to follow a speed change before an epoch ends)"
        >>> describe(16, every=None, warmup_steps=3, first_epoch=True, lock_step=True)
        "at every epoch's end and after step 9 of this first epoch (to measure its first split early); epochs of 16 steps are too short to adjust every 32 steps inside them"
        >>> describe(16, every=None, warmup_steps=3, first_epoch=False, lock_step=True)  # a resumed run
        "at every epoch's end; epochs of 16 steps are too short to adjust every 32 steps inside them"
        >>> describe(16, every=4, warmup_steps=3, first_epoch=True, lock_step=True)
        "at every epoch's end and every 4 steps inside it (adjust_every_n_steps=4)"
        >>> describe(100, every=4, warmup_steps=3, first_epoch=True, lock_step=False)
        "at every epoch's end (the strategy's ranks do not step together inside an epoch)"
    """
    if not lock_step:
        return "at every epoch's end (the strategy's ranks do not step together inside an epoch)"
    if every is not None:
        return f"at every epoch's end and every {every} steps inside it (adjust_every_n_steps={every})"
    early = early_steps(steps_in_epoch, warmup_steps) if first_epoch else ()
    parts = ["at every epoch's end"]
    if early:
        named, plural = " and ".join(str(step) for step in early), "s" if len(early) > 1 else ""
        parts.append(f"after step{plural} {named} of this first epoch (to measure its first split{plural} early)")
    if steps_in_epoch > STEADY_PERIOD:
        parts.append(
            f"and every {STEADY_PERIOD} steps inside epochs of {steps_in_epoch} steps (to follow a speed "
            "change before an epoch ends)"
        )
        return ", ".join(parts)
    short = f"epochs of {steps_in_epoch} steps are too short to adjust every {STEADY_PERIOD} steps inside them"
    return f"{' and '.join(parts)}; {short}"


#: how many of the synchronous step's wall times are kept for one split
SYNC_STEPS_KEPT = 32


class MeasuredPeriod:
    """Steps recorded by :meth:`record`, handed over and cleared by :meth:`close`.

    Example::

        >>> period = MeasuredPeriod(skip=1)
        >>> for busy in (0.9, 0.030, 0.032):
        ...     period.record((48, 16), 0, busy_s=busy, floor_s=0.0, wall_s=busy + 0.001)
        >>> steps, busy, walls = period.close((48, 16), 0)
        >>> steps, round(busy, 3), walls, period.sync_walls
        ([(48, 0.03, 0.0), (48, 0.032, 0.0)], 0.031, [0.031, 0.033], [0.031, 0.033])
    """

    def __init__(self, skip: int = 0) -> None:
        self.to_skip = skip
        self._steps: list[tuple[tuple[int, ...], int, float, float, float]] = []
        self._sync: tuple[tuple[int, ...] | None, list[float]] = (None, [])
        #: this rank's median wait per step (wall less busy seconds) at its current size in the period last closed
        self.wait_s = math.nan

    def record(self, split: tuple[int, ...], rank: int, busy_s: float, floor_s: float, wall_s: float) -> None:
        """One finished step taken at ``split``: its busy seconds, CPU-at-quota floor and wall seconds."""
        if self.to_skip > 0:
            self.to_skip -= 1
        else:
            self._steps.append((split, split[rank], busy_s, floor_s, wall_s))

    def skip_next(self) -> None:
        """Do not count the next step (the first at a new split)."""
        self.to_skip = max(self.to_skip, 1)

    def close(self, current: Sequence[int], rank: int) -> tuple[list[tuple[int, float, float]], float, list[float]]:
        """End the period: ``(size, busy_s, floor_s)`` of every step for the cost model, this rank's mean busy time at
        its size in ``current`` (raised to the mean floor; NaN if none), and the period's synchronous-step walls."""
        current = tuple(current)
        for_model = [(size, busy, floor) for _, size, busy, floor, _ in self._steps]
        at_current = [(size, busy, floor, wall) for split, size, busy, floor, wall in self._steps if split == current]
        self._steps = []
        mine = [(busy, floor) for size, busy, floor, _ in at_current if size == current[rank]]
        busy_s = max(sum(b for b, _ in mine), sum(f for _, f in mine)) / len(mine) if mine else math.nan
        walls = [wall for *_, wall in at_current]
        waits = sorted(wall - busy for size, busy, _, wall in at_current if size == current[rank])
        self.wait_s = waits[len(waits) // 2] if waits else math.nan
        if self._sync[0] != current:
            self._sync = (current, [])
        self._sync[1][:] = (self._sync[1] + walls)[-SYNC_STEPS_KEPT:]
        return for_model, busy_s, walls

    @property
    def sync_walls(self) -> list[float]:
        """The synchronous step's wall times since the current split came into force (at most 32)."""
        return list(self._sync[1])

    def restart_sync(self, current: Sequence[int], walls: list[float]) -> None:
        """Keep only ``walls`` (the newest period's) for ``current``: some rank's speed changed."""
        self._sync = (tuple(current), list(walls))


#: the columns of a row, in order
FIELDS = (
    "overhead_s",
    "per_sample_s",
    "known_sizes",
    "sync_step_s",
    "busy_s",
    "changed",
    "position",
    "latest_overhead_s",
    "latest_per_sample_s",
    "latest_known_sizes",
    "sync_steps",
    "newest_sync_step_s",
    "newest_sync_steps",
    "relative_error",
    "memory_cap",
    "wait_s",
)


def trimmed(walls: list[float]) -> list[float]:
    """Without the longest step (a stall is not the split's doing).

    Example::

        >>> trimmed([0.03, 0.2, 0.031]), trimmed([0.2])
        ([0.03, 0.031], [0.2])
    """
    return sorted(walls)[: max(1, len(walls) - 1)]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def own_row(
    fit: tuple[float, float | None, int],
    latest_fit: tuple[float, float | None, int],
    changed: bool,
    position: int,
    busy_s: float,
    walls: list[float],
    newest_walls: list[float],
    relative_error: float,
    memory_cap: int | None = None,
    wait_s: float = math.nan,
) -> torch.Tensor:
    """This rank's row: its fit ``(overhead_s, per_sample_s or None, known sizes)`` as it stands and restarted from
    the newest period, whether it saw a change, its loader position, its mean busy seconds at its current size, the
    synchronous step's (trimmed) wall times since the split came into force and in the newest period only, and the
    relative standard error of its busy level at its current size
    (:meth:`~lightning_hetero.hetero_batch.cost_model.PeriodCostModel.relative_error`), and its memory cap (``None``:
    none known; see :mod:`~lightning_hetero.hetero_batch.memory`) and its median wait per step at its current size.

    Example::

        >>> row = own_row((0.002, 0.001, 2), (0.003, None, 1), False, 640, 0.034, [0.035, 0.036], [0.036], 0.01)
        >>> fields = dict(zip(FIELDS, row.tolist()))
        >>> round(fields["sync_step_s"], 6), fields["sync_steps"], math.isnan(fields["latest_per_sample_s"])
        (0.0355, 2.0, True)
    """
    values = (
        fit[0],
        math.nan if fit[1] is None else fit[1],
        fit[2],
        _mean(walls),
        busy_s,
        changed,
        position,
        latest_fit[0],
        math.nan if latest_fit[1] is None else latest_fit[1],
        latest_fit[2],
        len(walls),
        _mean(newest_walls),
        len(newest_walls),
        relative_error,
        math.nan if memory_cap is None else memory_cap,
        wait_s,
    )
    return torch.tensor([float(v) for v in values], dtype=torch.float64)


@dataclass(frozen=True)
class Exchanged:
    """What every rank reads from the gathered rows."""

    #: every rank's (overhead_s, per_sample_s); ``None`` while some rank has no fit yet
    costs: tuple[tuple[float, float], ...] | None
    #: how many distinct batch sizes each rank's fit rests on
    known_sizes: list[int]
    #: the synchronous step (the slowest rank's mean wall time per step); ``None`` unless every rank measured it
    sync_step_s: float | None
    #: the fewest steps any rank's synchronous-step figure rests on
    sync_steps: int
    #: every rank's mean busy seconds per step at its current size (NaN where unmeasured)
    busy_s: tuple[float, ...]
    #: every rank's relative standard error of its busy level at its current size (NaN where unmeasured)
    relative_errors: tuple[float, ...]
    #: which ranks saw their speed change; if any did, every rank restarts from its newest period
    changed: tuple[bool, ...]
    #: the furthest any rank's loader got (a new split starts after it)
    position: int
    #: every rank's largest batch known to fit in memory (NaN: none known)
    memory_caps: tuple[float, ...] = ()
    #: every rank's median wait per step at its current size (NaN where unmeasured)
    waits_s: tuple[float, ...] = ()


def read_rows(rows: torch.Tensor) -> Exchanged:
    """Read the stacked rows of all ranks (one per rank, in rank order).

    Example::

        >>> a = own_row((0.002, 0.001, 2), (0.002, 0.001, 2), False, 10, 0.034, [0.035], [0.035], 0.01)
        >>> b = own_row((0.004, 0.002, 2), (0.009, 0.003, 1), True, 12, 0.070, [0.071, 0.5], [0.071], 0.02)
        >>> seen = read_rows(torch.stack([a, b]))
        >>> seen.costs, seen.changed, seen.position, seen.sync_step_s
        (((0.002, 0.001), (0.004, 0.002)), (False, True), 12, 0.071)
    """
    # plain Python on one list: cheaper than a dozen torch ops on a tiny tensor
    table = [dict(zip(FIELDS, row, strict=True)) for row in rows.tolist()]
    changed = tuple(bool(row["changed"]) for row in table)
    if any(changed):
        # a rank that saw a change already restarted; the others read their fit restarted from the newest period
        for row, restarted in zip(table, changed, strict=True):
            if not restarted:
                for name in ("overhead_s", "per_sample_s", "known_sizes"):
                    row[name] = row[f"latest_{name}"]
            row["sync_step_s"], row["sync_steps"] = row["newest_sync_step_s"], row["newest_sync_steps"]
    fits = [(row["overhead_s"], row["per_sample_s"]) for row in table]
    costs = None if any(math.isnan(v) for fit in fits for v in fit) else tuple(fits)
    walls = [row["sync_step_s"] for row in table if math.isfinite(row["sync_step_s"])]
    return Exchanged(
        costs=costs,
        known_sizes=[int(row["known_sizes"]) for row in table],
        sync_step_s=max(walls) if len(walls) == len(table) else None,
        sync_steps=int(min(row["sync_steps"] for row in table)),
        busy_s=tuple(row["busy_s"] for row in table),
        relative_errors=tuple(row["relative_error"] for row in table),
        changed=changed,
        position=int(max(row["position"] for row in table)),
        memory_caps=tuple(row["memory_cap"] for row in table),
        waits_s=tuple(row["wait_s"] for row in table),
    )


def gather_rows(strategy: Any, row: torch.Tensor, busy: BusyTimer) -> torch.Tensor:
    """Every rank's ``row`` stacked in rank order, the time spent counted as a wait of ``busy``: one collective
    under DDP (the strategy's ``all_gather`` adds a barrier and an exchange of shapes: three collectives).

    Example::

        >>> from lightning.pytorch.strategies import SingleDeviceStrategy
        >>> gather_rows(SingleDeviceStrategy("cpu"), torch.ones(3), BusyTimer()).shape
        torch.Size([1, 3])
    """
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if distributed and torch.distributed.get_backend() == "nccl":  # NCCL gathers device tensors only (DDP, FSDP)
        row = row.to(strategy.root_device)
    if isinstance(strategy, DDPStrategy) and distributed:
        rows = [torch.empty_like(row) for _ in range(torch.distributed.get_world_size())]
        with busy.waiting():
            torch.distributed.all_gather(rows, row)
        return torch.stack(rows).cpu()
    return strategy.all_gather(row).reshape(-1, row.numel()).cpu()
