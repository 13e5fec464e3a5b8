"""The statistics the studies report: medians that tolerate empty input, paired ratios, interleaving orders, the time
to reach an accuracy, and the batch splits proportional to speed that the sweeps try."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from lightning_hetero.allocation import apportion

T = TypeVar("T")


def median(values: Iterable[float | None]) -> float | None:
    """The median of the values that are not ``None``; ``None`` if there are none.

    Example::

        >>> median([3.0, None, 1.0, 2.0]), median([])
        (2.0, None)
    """
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def mean(values: Iterable[float | None]) -> float | None:
    """The mean of the values that are not ``None``; ``None`` if there are none."""
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def seed_paired(runs: list[dict], keys: Sequence[str], reference: str) -> Iterator[tuple[tuple, list, list]]:
    """Runs grouped by ``(*keys, "config")``: each group's key, its runs, and its runs paired by seed with the
    ``reference`` configuration's run in the same cell (a run with no such run is left out of the pairs)."""
    references = {(*(r[k] for k in keys), r["seed"]): r for r in runs if r["config"] == reference}
    cells: dict[tuple, list[dict]] = {}
    for run in runs:
        cells.setdefault((*(run[k] for k in keys), run["config"]), []).append(run)
    for key, group in cells.items():
        pairs = [(r, references[(*key[:-1], r["seed"])]) for r in group if (*key[:-1], r["seed"]) in references]
        yield key, group, pairs


def within_budget(cells: Iterable[T], budget_s: float, skipped: list[T]) -> Iterator[T]:
    """The cells, until ``budget_s`` seconds have passed since the first; the rest go to ``skipped``."""
    started = time.perf_counter()
    for cell in cells:
        if time.perf_counter() - started > budget_s:
            skipped.append(cell)
        else:
            yield cell


def paired_ratios(ours: Sequence[float], reference: Sequence[float]) -> list[float]:
    """Per-repeat ratios of two arms' figures (both in repeat order)."""
    return [o / r for o, r in zip(ours, reference, strict=True)]


def rotating_order(arms: Sequence[T], repeats: int) -> list[T]:
    """Each repeat runs every arm back to back; which arm goes first rotates from one repeat to the next."""
    return [arms[(i + j) % len(arms)] for i in range(repeats) for j in range(len(arms))]


def time_to_target(
    epochs: list[dict[str, Any]], target: float, curve: list[tuple[float, float]] | None = None
) -> float | None:
    """Training seconds until the validation accuracy first reaches ``target``: the first ``(train_s, acc)`` point
    of ``curve`` that does, or without a curve the cumulative training time at the first epoch end that does."""
    if curve:
        return next((train_s for train_s, acc in curve if acc >= target), None)
    elapsed = 0.0
    for epoch in epochs:
        elapsed += epoch["train_s"]
        if epoch["val_acc"] is not None and epoch["val_acc"] >= target:
            return elapsed
    return None


def proportional_splits(speeds: Sequence[float], total: int, gammas: Sequence[float] = (1.0,)) -> list[list[int]]:
    """``total`` samples split in proportion to ``speed ** gamma`` for each of ``gammas`` (at least one each), each
    distinct split once.

    Example::

        >>> proportional_splits([1.0, 0.25], 64, (1.0, 3.0))
        [[52, 12], [63, 1]]
    """
    splits: list[list[int]] = []
    for gamma in gammas:
        split = apportion([speed**gamma for speed in speeds], total, [1] * len(speeds), [total] * len(speeds))
        if split not in splits:
            splits.append(split)
    return splits
