"""HeteroBatch's logged metrics and end-of-fit summary: per-rank sizes, predicted and measured busy time per step, the synchronous step.

Times rather than samples/s: at a small batch a rank's samples/s mostly reflects its fixed cost per step and says
little about how fast it is. The predicted step-time ratio of equal batches to the current split is labelled as a
model prediction; the measured synchronous step is the ground truth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


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
