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
from typing import Any

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
        if high - low <= 1e-12 * high:
            break
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


def order_by_speed(
    sizes: Sequence[int], step_times_s: Sequence[float], lower: Sequence[int], upper: Sequence[int]
) -> tuple[int, ...]:
    """Swap sizes until no rank that is faster (a shorter predicted step at a common batch size) has fewer samples.

    A min-max split of crossing cost lines can hand a slower rank more samples than a faster one; a noisy fit can do
    it too. Swapping keeps the multiset of sizes (so the sum) and is skipped only when a rank's bounds forbid it.

    Example::

        >>> order_by_speed([40, 24], step_times_s=[0.02, 0.01], lower=[1, 1], upper=[64, 64])
        (24, 40)
        >>> order_by_speed([40, 24], step_times_s=[0.02, 0.01], lower=[1, 1], upper=[64, 30])  # rank 1 capped at 30
        (40, 24)
    """
    sizes = list(sizes)
    n = len(sizes)
    swapped = True
    while swapped:
        swapped = False
        for i in range(n):
            for j in range(n):
                faster = step_times_s[i] < step_times_s[j] * (1 - 1e-9)
                if (
                    faster
                    and sizes[i] < sizes[j]
                    and lower[i] <= sizes[j] <= upper[i]
                    and lower[j] <= sizes[i] <= upper[j]
                ):
                    sizes[i], sizes[j] = sizes[j], sizes[i]
                    swapped = True
    return tuple(sizes)


@dataclass(frozen=True)
class Decision:
    """The controller's answer: the proposed split, its predicted gain, and whether it is worth applying.

    ``predicted_gain`` is the fraction by which the synchronous step is predicted to shorten (``0.25``: a quarter).
    ``reason`` says why: ``"balance"`` (equalise the predicted step times), ``"refine"`` (a balancing move whose
    predicted gain is under the deadband but was proposed at two adjustments in a row), ``"rollback"`` (the last
    change made the measured synchronous step slower: return to the split before it), ``"explore"`` (try a rank
    that sat at its minimum one notch higher, to learn its cost at another size) or ``"hold"`` (keep the split until
    the last change has been measured on enough steps).
    """

    sizes: tuple[int, ...]
    predicted_gain: float
    apply: bool
    reason: str = "balance"


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
        Decision(sizes=(48, 16), predicted_gain=0.5, apply=True, reason='balance')
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
        """Propose a split and say whether its predicted gain over ``current`` clears the deadband.

        The proposal never gives a slower rank (longer predicted step at the equal share) more samples than a
        faster one (:func:`order_by_speed`).
        """
        proposed = self.propose(throughputs, overheads_s)
        equal_share = self.global_batch_size / self.world_size
        times = [a + equal_share / x for a, x in zip(overheads_s or [0.0] * self.world_size, throughputs, strict=True)]
        proposed = order_by_speed(proposed, times, self.lower, self.upper)
        now = step_time_s(current, throughputs, overheads_s)
        gain = (now - step_time_s(proposed, throughputs, overheads_s)) / now
        return Decision(sizes=proposed, predicted_gain=gain, apply=proposed != tuple(current) and gain > self.deadband)


class AdjustmentPolicy:
    """What to do at one adjustment, from every rank's fitted cost and the measured synchronous step: a stateful,
    deterministic wrapper around :class:`BatchSizeController` that checks its own decisions against measurements.

    - **Balance**: the min-max split of the fitted costs, never inverted (:func:`order_by_speed`), applied when its
      predicted gain clears the deadband.
    - **Refine**: a balancing split whose predicted gain is under the deadband is still applied when the gain
      exceeds ``refine_gain`` and twice the noise of the comparison (``2 x sqrt(2) x`` the largest relative
      standard error of a rank's measured level), the adjustment before proposed the same split (``refine_after``
      adjustments in a row), and it is not the split the last change left (no A -> B -> A). Near the balance point
      one sample can be worth 2-5% of the step (a rank at 20 samples of a 64-sample global batch): the deadband
      alone stops one sample short, and the noise gate and persistence keep noise from moving the split.
    - **Rollback**: each applied change is a trial. Once the synchronous step at the new split rests on at least
      ``min_sync_steps`` steps, it is compared with the one measured before the change; if it is slower by more
      than ``rollback_tolerance``, the previous split comes back (unless that split is now inverted, i.e. the ranks'
      speeds changed under it) and the rejected split is not proposed again for ``reject_periods`` adjustments.
      Until then the split is held (a change takes effect a step or two after it is decided, so with short
      periods the first measurement at it can rest on one step, and one throttled step must not undo it); a
      baseline on fewer steps judges nothing.
    - **Explore**: a rank that sat at its lower bound for ``explore_after`` adjustments while its cost was known at a
      single batch size is offered one notch more, so its cost can be measured at a second size and it can leave
      the minimum when the minimum was a misfit (a trial like any other: rolled back if slower).

    Args:
        controller: the bounds, global batch and deadband.
        rollback_tolerance: fractional slow-down of the measured synchronous step that rolls a change back.
        reject_periods: adjustments during which a rolled-back split is not proposed again.
        explore_after: adjustments at the lower bound (with one known size) before exploring; ``None``: never.
        min_sync_steps: steps a synchronous-step measurement needs to judge a trial (when the caller gives counts).
        refine_gain: smallest predicted gain of a refinement (below the controller's deadband); ``None``: never refine.
        refine_after: adjustments in a row that must propose the same refinement before it is applied.

    Example::

        >>> policy = AdjustmentPolicy(BatchSizeController(global_batch_size=64, world_size=2))
        >>> policy.decide([32, 32], costs=[(0.0, 0.001), (0.0, 0.004)], sync_step_s=0.128).sizes
        (52, 12)
        >>> # measured after the change: 0.160 s, slower than before by more than 15%: back to [32, 32]
        >>> policy.decide([52, 12], costs=[(0.0, 0.001), (0.0, 0.004)], sync_step_s=0.160).reason
        'rollback'
        >>> policy.decide([32, 32], costs=[(0.0, 0.001), (0.0, 0.004)], sync_step_s=0.128).apply  # (52, 12) rejected
        False
    """

    def __init__(
        self,
        controller: BatchSizeController,
        rollback_tolerance: float = 0.15,
        reject_periods: int = 3,
        explore_after: int | None = 3,
        min_sync_steps: int = 3,
        refine_gain: float | None = 0.02,
        refine_after: int = 2,
    ) -> None:
        if not math.isfinite(rollback_tolerance) or rollback_tolerance < 0:
            raise ValueError(f"rollback_tolerance must be a finite number >= 0, got {rollback_tolerance!r}")
        if reject_periods < 0:
            raise ValueError(f"reject_periods must be >= 0, got {reject_periods}")
        if explore_after is not None and explore_after < 1:
            raise ValueError(f"explore_after must be >= 1 or None, got {explore_after}")
        if min_sync_steps < 1:
            raise ValueError(f"min_sync_steps must be >= 1, got {min_sync_steps}")
        if refine_gain is not None and (not math.isfinite(refine_gain) or refine_gain < 0):
            raise ValueError(f"refine_gain must be a finite number >= 0 or None, got {refine_gain!r}")
        if refine_after < 1:
            raise ValueError(f"refine_after must be >= 1, got {refine_after}")
        self.controller = controller
        self.min_sync_steps = min_sync_steps
        self.rollback_tolerance = rollback_tolerance
        self.reject_periods = reject_periods
        self.explore_after = explore_after
        self.refine_gain = refine_gain
        self.refine_after = refine_after
        #: (split before the last change, synchronous step measured at it, its steps); None when no trial is pending
        self._trial: tuple[tuple[int, ...], float | None, int | None] | None = None
        self._rejected: dict[tuple[int, ...], int] = {}
        self._at_floor = [0] * controller.world_size
        #: the refinement proposed at the last adjustment, and at how many adjustments in a row
        self._proposed: tuple[tuple[int, ...], int] | None = None
        self._left: tuple[int, ...] | None = None  # the split the last applied change left

    def decide(
        self,
        current: Sequence[int],
        costs: Sequence[tuple[float, float]],
        sync_step_s: float | None = None,
        known_sizes: Sequence[int] | None = None,
        sync_steps: int | None = None,
        relative_errors: Sequence[float] | None = None,
    ) -> Decision:
        """Decide from every rank's ``(overhead_s, per_sample_s)`` and the synchronous step measured at ``current``.

        ``known_sizes``: how many distinct batch sizes each rank's cost model rests on (for exploration).
        ``sync_steps``: how many steps ``sync_step_s`` rests on (``None``: enough).
        ``relative_errors``: each rank's relative standard error of its measured level at ``current`` (for
        refinements; ``None``: not known, no noise gate; NaN: unmeasured, no refinement).

        Example::

            >>> policy = AdjustmentPolicy(BatchSizeController(global_batch_size=64, world_size=2))
            >>> costs = [(0.0, 0.001), (0.0, 0.004)]
            >>> policy.decide([32, 32], costs, sync_step_s=0.128, sync_steps=6).sizes
            (52, 12)
            >>> policy.decide([52, 12], costs, sync_step_s=0.160, sync_steps=1).reason  # one step: held, not judged
            'hold'
            >>> policy.decide([52, 12], costs, sync_step_s=0.066, sync_steps=5).apply  # judged: faster, kept
            False
        """
        controller = self.controller
        current = tuple(current)
        rates = [1.0 / c for _, c in costs]
        overheads = [a for a, _ in costs]
        equal_share = controller.global_batch_size / controller.world_size
        speed_times = [a + equal_share * c for a, c in costs]
        self._rejected = {split: left - 1 for split, left in self._rejected.items() if left > 1}
        trial, self._trial = self._trial, None
        enough = sync_steps is None or sync_steps >= self.min_sync_steps
        if trial is not None and not enough and trial[2] is not None and trial[2] >= self.min_sync_steps:
            self._trial = trial  # judge it once the new split has been measured on enough steps
            return Decision(current, 0.0, apply=False, reason="hold")
        if trial is not None and (trial[2] is None or trial[2] >= self.min_sync_steps):
            before, before_s, _ = trial
            inverted = order_by_speed(before, speed_times, controller.lower, controller.upper) != before
            slower = (
                sync_step_s is not None
                and before_s is not None
                and sync_step_s > before_s * (1 + self.rollback_tolerance)
            )
            if slower and not inverted and before != current:
                if self.reject_periods:
                    self._rejected[current] = self.reject_periods
                assert sync_step_s is not None and before_s is not None
                self._left, self._proposed = current, None
                return Decision(before, (before_s - sync_step_s) / sync_step_s, apply=True, reason="rollback")

        decision = controller.decide(current, rates, overheads)
        reason = "balance"
        proposed = decision.sizes
        refinable = (
            self.refine_gain is not None
            and not decision.apply
            and proposed != current
            and proposed != self._left
            and decision.predicted_gain > self.refine_gain
            and decision.predicted_gain > 2 * math.sqrt(2) * _largest(relative_errors or [0.0])
        )
        in_a_row = self._proposed[1] + 1 if refinable and self._proposed and self._proposed[0] == proposed else 1
        if refinable and in_a_row >= self.refine_after:
            reason = "refine"
        self._proposed = (proposed, in_a_row) if refinable and reason != "refine" else None
        self._at_floor = [
            n + 1 if b <= lo else 0 for n, b, lo in zip(self._at_floor, current, controller.lower, strict=True)
        ]
        explorable = [
            k
            for k in range(controller.world_size)
            if self.explore_after is not None
            and self._at_floor[k] >= self.explore_after
            and proposed[k] <= controller.lower[k]
            and (known_sizes is None or known_sizes[k] <= 1)
        ]
        if explorable and not decision.apply and reason != "refine":
            k = explorable[0]
            donors = [j for j in range(controller.world_size) if j != k and proposed[j] > controller.lower[j]]
            if donors and proposed[k] < controller.upper[k]:
                donor = max(donors, key=lambda j: (proposed[j], -j))
                step = min(max(1, controller.lower[k] // 2), proposed[donor] - controller.lower[donor])
                explored = list(proposed)
                explored[k] += min(step, controller.upper[k] - proposed[k])
                explored[donor] -= explored[k] - proposed[k]
                proposed, reason = tuple(explored), "explore"
                self._at_floor[k] = 0
        apply = proposed != current and proposed not in self._rejected and (decision.apply or reason != "balance")
        if apply:
            self._trial = (current, sync_step_s, sync_steps)
            self._left, self._proposed = current, None
        now = step_time_s(current, rates, overheads)
        gain = (now - step_time_s(proposed, rates, overheads)) / now
        return Decision(proposed, gain, apply=apply, reason=reason)

    def state_dict(self) -> dict[str, Any]:
        return {
            "rejected": [[list(split), left] for split, left in self._rejected.items()],
            "at_floor": self._at_floor,
            "proposed": None if self._proposed is None else [list(self._proposed[0]), self._proposed[1]],
            "left": None if self._left is None else list(self._left),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rejected = {tuple(split): int(left) for split, left in state.get("rejected", [])}
        at_floor = list(state.get("at_floor", []))
        if len(at_floor) == self.controller.world_size:
            self._at_floor = at_floor
        proposed = state.get("proposed")
        self._proposed = None if proposed is None else (tuple(proposed[0]), int(proposed[1]))
        self._left = None if state.get("left") is None else tuple(state["left"])


def _largest(values: Sequence[float]) -> float:
    """The largest value, infinite if any is NaN (unmeasured)."""
    return max(values) if all(math.isfinite(v) for v in values) else math.inf


def _per_rank(name: str, value: int | Sequence[int] | None, world_size: int, default: int) -> list[int]:
    if value is None:
        return [default] * world_size
    if isinstance(value, int):
        return [value] * world_size
    values = [int(v) for v in value]
    if len(values) != world_size:
        raise ValueError(f"{name} needs one entry per rank ({world_size}), got {len(values)}")
    return values
