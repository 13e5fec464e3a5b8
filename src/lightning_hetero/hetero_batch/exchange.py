"""HeteroBatch's one exchange per adjustment: what each rank sends, and what every rank reads from all the rows.

Each rank sends one float64 row (:func:`own_row`); after one ``all_gather`` every rank reads the same
:class:`Exchanged` from the stacked rows (:func:`read_rows`) and so takes the same decision. A row carries both the
rank's fit as it stands and its fit restarted from the newest period, so that when any rank saw its speed change
all ranks restart together without a second exchange.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy

from lightning_hetero.measurement import BusyTimer

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
) -> torch.Tensor:
    """This rank's row: its fit ``(overhead_s, per_sample_s or None, known sizes)`` as it stands and restarted from
    the newest period, whether it saw a change, its loader position, its mean busy seconds at its current size, the
    synchronous step's (trimmed) wall times since the split came into force and in the newest period only, and the
    relative standard error of its busy level at its current size
    (:meth:`~lightning_hetero.hetero_batch.cost_model.PeriodCostModel.relative_error`), and its memory cap (``None``:
    none known; see :mod:`~lightning_hetero.hetero_batch.memory`).

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
