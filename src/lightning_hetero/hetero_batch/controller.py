"""The batch-size controller: per-rank batch sizes proportional to measured throughput.

Pure arithmetic with no torch.distributed in it. Every rank feeds it the same all-gathered throughputs and so
reaches the same decision.

Each rank's compute per step is modelled as ``t_k(b) = a_k + b / X_k`` (a fixed overhead ``a_k`` plus samples at
throughput ``X_k``; with ``a_k = 0`` this is OmniLearn's ``b_k ∝ X_k``). The split equalises the predicted step
times: real-valued targets ``x_k = clip(X_k·(T - a_k), lo_k, hi_k)`` with the common step time ``T`` chosen so that
they sum to the global batch (a rank clipped at its bound hands its excess to the others), then largest-remainder
rounding to integers that sum to the global batch exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from lightning_hetero._validation import check_finite


def apportion(
    weights: Sequence[float],
    total: int,
    lower: Sequence[int],
    upper: Sequence[int],
    offsets: Sequence[float] | None = None,
) -> list[int]:
    """Split ``total`` into integers ``≈ clip(w_k·(T - offset_k), lower_k, upper_k)`` that sum to ``total``.

    Without offsets the split is proportional to ``weights``. Ranks with equal weights, offsets and bounds get
    sizes that differ by at most one, and a larger weight never gets a smaller size under the same bounds and
    offsets.

    Example::

        >>> apportion([1.0, 1.0, 2.0], total=10, lower=[1, 1, 1], upper=[10, 10, 10])
        [3, 2, 5]
        >>> apportion([1.0, 9.0], total=20, lower=[1, 1], upper=[20, 12])  # rank 1 capped, excess to rank 0
        [8, 12]
        >>> apportion([1.0, 1.0], total=20, lower=[1, 1], upper=[20, 20], offsets=[0.0, 4.0])  # rank 1 pays 4 more
        [12, 8]
    """
    n = len(weights)
    if not n or len(lower) != n or len(upper) != n:
        raise ValueError("weights, lower and upper must be non-empty and of equal length")
    if any(lo > hi for lo, hi in zip(lower, upper, strict=True)):
        raise ValueError(f"every lower bound must be <= its upper bound, got lower={list(lower)} upper={list(upper)}")
    if not sum(lower) <= total <= sum(upper):
        raise ValueError(f"cannot split {total} within bounds summing to [{sum(lower)}, {sum(upper)}]")
    if any(not math.isfinite(w) or w < 0 for w in weights):
        raise ValueError(f"weights must be finite and non-negative, got {list(weights)}")
    if max(weights) <= 1e-12:
        weights = [1.0] * n
    # A zero-weight rank grows only once every other rank is at its upper bound.
    floor_weight = max(weights) * 1e-9
    weights = [max(w, floor_weight) for w in weights]

    offsets = [0.0] * n if offsets is None else [float(a) for a in offsets]
    if len(offsets) != n or any(not math.isfinite(a) or a < 0 for a in offsets):
        raise ValueError(f"offsets must be one finite, non-negative value per rank, got {offsets}")

    def filled(level: float) -> list[float]:
        return [min(max(w * (level - a), lo), hi) for w, a, lo, hi in zip(weights, offsets, lower, upper, strict=True)]

    # sum(filled(level)) is non-decreasing in level: bisect for the level that fills exactly `total`.
    low, high = 0.0, max(offsets) + 1.0
    while sum(filled(high)) < total:
        high *= 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if sum(filled(mid)) < total:
            low = mid
        else:
            high = mid
    targets = filled(high)

    # Round down, then hand out the remaining samples one at a time to the rank whose predicted step time after
    # taking it is smallest (greedy is optimal for this min-max problem: every rank's time grows with its batch).
    sizes = [min(max(math.floor(x), lo), hi) for x, lo, hi in zip(targets, lower, upper, strict=True)]

    def time_with(k: int, size: int) -> float:
        return offsets[k] + size / weights[k]

    deficit = total - sum(sizes)
    while deficit > 0:
        k = min((k for k in range(n) if sizes[k] < upper[k]), key=lambda k: (time_with(k, sizes[k] + 1), k))
        sizes[k] += 1
        deficit -= 1
    while deficit < 0:
        k = max((k for k in range(n) if sizes[k] > lower[k]), key=lambda k: (time_with(k, sizes[k]), -k))
        sizes[k] -= 1
        deficit += 1
    return sizes


def step_time_s(
    sizes: Sequence[int], throughputs: Sequence[float], overheads_s: Sequence[float] | None = None
) -> float:
    """A synchronous step lasts as long as its slowest rank: ``max_k a_k + b_k / X_k``.

    Example::

        >>> step_time_s([16, 16], [100.0, 25.0])
        0.64
        >>> step_time_s([16, 16], [100.0, 25.0], overheads_s=[0.5, 0.0])
        0.66
    """
    overheads_s = overheads_s or [0.0] * len(sizes)
    return max(a + b / x for b, x, a in zip(sizes, throughputs, overheads_s, strict=True))


@dataclass(frozen=True)
class Decision:
    """The controller's answer: the proposed split, its predicted gain, and whether it is worth applying.

    ``predicted_gain`` is the fraction by which the synchronous step is predicted to shorten (``0.25``: a quarter).
    """

    sizes: tuple[int, ...]
    predicted_gain: float
    apply: bool


class BatchSizeController:
    """Per-rank batch sizes that equalise step times, with bounds, a constant global batch and a deadband.

    Args:
        global_batch_size: the sum of all ranks' batch sizes, kept exactly constant.
        world_size: number of ranks.
        min_batch_size: smallest batch a rank may get (an int for all ranks, or one per rank).
        max_batch_size: largest batch a rank may get (an int, one per rank, or ``None`` for no bound).
        memory_caps: optional per-rank largest batch that fits in memory; combined with ``max_batch_size``.
        deadband: a new split is applied only when it is predicted to shorten the synchronous step by more than
            this fraction, so sizes do not flap on measurement noise. The decision is cluster-wide: every rank
            computes it from the same all-gathered measurements.

    Example::

        >>> controller = BatchSizeController(global_batch_size=64, world_size=2, min_batch_size=4, deadband=0.05)
        >>> controller.decide(current=[32, 32], throughputs=[300.0, 100.0])
        Decision(sizes=(48, 16), predicted_gain=0.5, apply=True)
        >>> controller.decide(current=[48, 16], throughputs=[315.0, 100.0]).apply  # proposes (49, 15): 3% gain
        False
    """

    def __init__(
        self,
        global_batch_size: int,
        world_size: int,
        min_batch_size: int | Sequence[int] = 1,
        max_batch_size: int | Sequence[int] | None = None,
        memory_caps: Sequence[int | None] | None = None,
        deadband: float = 0.05,
    ) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if global_batch_size < 1:
            raise ValueError(f"global_batch_size must be positive, got {global_batch_size}")
        check_finite(deadband=deadband)
        if deadband < 0:
            raise ValueError(f"deadband must be >= 0, got {deadband}")
        self.global_batch_size = global_batch_size
        self.world_size = world_size
        self.deadband = deadband
        self.lower = _per_rank("min_batch_size", min_batch_size, world_size, default=1)
        upper = _per_rank("max_batch_size", max_batch_size, world_size, default=global_batch_size)
        if memory_caps is not None:
            if len(memory_caps) != world_size:
                raise ValueError(f"memory_caps needs one entry per rank ({world_size}), got {len(memory_caps)}")
            upper = [hi if cap is None else min(hi, int(cap)) for hi, cap in zip(upper, memory_caps, strict=True)]
        self.upper = upper
        if sum(self.lower) > global_batch_size:
            raise ValueError(
                f"global_batch_size ({global_batch_size}) is smaller than world_size x min_batch_size "
                f"({sum(self.lower)}): lower min_batch_size or raise the global batch"
            )
        for rank, (lo, hi) in enumerate(zip(self.lower, self.upper, strict=True)):
            if lo < 1:
                raise ValueError(f"min_batch_size must be positive, got {lo} for rank {rank}")
            if lo > hi:
                raise ValueError(f"min_batch_size ({lo}) exceeds max_batch_size/memory cap ({hi}) for rank {rank}")
        if sum(self.upper) < global_batch_size:
            raise ValueError(
                f"global_batch_size ({global_batch_size}) exceeds the sum of the per-rank maxima "
                f"({sum(self.upper)}): raise max_batch_size / memory_caps or lower the global batch"
            )

    def equal_split(self) -> tuple[int, ...]:
        """The split a plain DDP job would use (equal shares, within the bounds)."""
        return tuple(apportion([1.0] * self.world_size, self.global_batch_size, self.lower, self.upper))

    def propose(self, throughputs: Sequence[float], overheads_s: Sequence[float] | None = None) -> tuple[int, ...]:
        """The split that equalises predicted step times, ignoring the deadband.

        ``throughputs`` are per-sample rates (samples/s per rank); ``overheads_s`` the fixed per-step costs.
        """
        if len(throughputs) != self.world_size:
            raise ValueError(f"expected {self.world_size} throughputs, got {len(throughputs)}")
        return tuple(apportion(throughputs, self.global_batch_size, self.lower, self.upper, offsets=overheads_s))

    def decide(
        self, current: Sequence[int], throughputs: Sequence[float], overheads_s: Sequence[float] | None = None
    ) -> Decision:
        """Propose a split and say whether its predicted gain over ``current`` clears the deadband."""
        proposed = self.propose(throughputs, overheads_s)
        now = step_time_s(current, throughputs, overheads_s)
        gain = (now - step_time_s(proposed, throughputs, overheads_s)) / now
        return Decision(sizes=proposed, predicted_gain=gain, apply=proposed != tuple(current) and gain > self.deadband)


def _per_rank(name: str, value: int | Sequence[int] | None, world_size: int, default: int) -> list[int]:
    if value is None:
        return [default] * world_size
    if isinstance(value, int):
        return [value] * world_size
    values = [int(v) for v in value]
    if len(values) != world_size:
        raise ValueError(f"{name} needs one entry per rank ({world_size}), got {len(values)}")
    return values
