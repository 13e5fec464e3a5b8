"""HeteroBatch's adjustment policy: what to do at one adjustment, one method per rule (hold, rollback, return,
balance, refine, explore, nudge), each change of split a :class:`Trial` judged by the synchronous step measured
after it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from lightning_hetero._validation import check_range
from lightning_hetero.allocation import line_times_s, order_by_speed, step_time_s
from lightning_hetero.hetero_batch.controller import (
    QUOTA_PERIOD_S,
    BatchSizeController,
    Decision,
    Outcome,
    Proposal,
    Rejection,
    Stalls,
    Trial,
)

#: steps both splits need for the finer margin of a return (two periods of 8)
LONG_STEPS = 16


class AdjustmentPolicy:
    """What to do at one adjustment, from every rank's fitted cost and the measured synchronous step: a stateful,
    deterministic wrapper around :class:`BatchSizeController` that checks its own decisions against measurements.

    - **Balance**: the min-max split of the fitted costs, never inverted (:func:`order_by_speed`), applied when its
      predicted gain clears the deadband.
    - **Refine**: a balancing split whose predicted gain is under the deadband is still applied when the gain
      exceeds ``refine_gain`` and twice the noise of the comparison (``2 x sqrt(2) x`` the largest relative
      standard error of a rank's measured level), the adjustment before proposed the same split (``refine_after``
      adjustments in a row), and it is not the split the last change left (no A -> B -> A).
    - **Outcomes**: the synchronous step measured at every split run (:class:`Outcome`: its time-weighted mean over
      all the steps measured there, across stints) decides between splits; the fitted costs only propose. A proposal
      is not applied when its split was measured slower than the one in force.
    - **Rollback**: each applied change is a trial. Once the synchronous step at the new split rests on at least
      ``min_sync_steps`` steps, it is compared with the one measured before the change; if it is slower by more
      than ``rollback_tolerance``, the previous split comes back (unless that split is now inverted, i.e. the ranks'
      speeds changed under it). The rejected move is remembered (:class:`Rejection`): no move from the restored
      split the same way is proposed again. Until then the split is held; a baseline on fewer steps, or on less
      than a CPU quota's period (:data:`QUOTA_PERIOD_S`) of them, judges nothing.
    - **Return**: when the split in force measured slower than another measured split by more than
      ``rollback_tolerance`` (twice ``refine_gain`` once both rest on :data:`LONG_STEPS`), that one comes back.
    - **Stalls**: no proposal gives a rank as many samples as it was seen stalling at (:class:`Stalls`).
    - **Nudge**: when no rule moves and the stalls cost time (the step exceeds the busiest rank's mean busy time and
      the all-reduce's share by over twice ``refine_gain``), one unit moves from the stalling rank to the least busy
      one; it is rolled back when measured slower by more than ``refine_gain``.
    - **Speed changes**: the outcomes and rejections are forgotten only when a rank's speed measurably changed while
      the split stayed the same: a cost model reports a change (``speeds_changed``) and the synchronous step at the
      split in force differs from the one measured there before by more than ``change_tolerance`` (under a CPU
      quota a rank's per-step figures change with its batch size, so a reported change alone proves nothing).
    - **Explore**: a rank at its lower bound for ``explore_after`` adjustments, its cost known at one size only, is
      offered one notch more (a trial like any other).

    Args:
        controller: the bounds, global batch and deadband.
        rollback_tolerance: fractional slow-down of the measured synchronous step that rolls a change back.
        reject_periods: 0 forgets rolled-back moves at once (any other value: until a rank's speed changes).
        explore_after: adjustments at the lower bound (with one known size) before exploring; ``None``: never.
        min_sync_steps: steps a synchronous-step measurement needs to judge a trial (when the caller gives counts).
        refine_gain: smallest predicted gain of a refinement (below the controller's deadband); ``None``: never refine.
        refine_after: adjustments in a row that must propose the same refinement before it is applied.
        change_tolerance: fractional change of the synchronous step at an unchanged split that is a speed change.

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
        change_tolerance: float = 0.4,
    ) -> None:
        check_range("rollback_tolerance", rollback_tolerance, low=0)
        check_range("reject_periods", reject_periods, low=0, integer=True)
        check_range("explore_after", explore_after, low=1, integer=True, optional=True)
        check_range("min_sync_steps", min_sync_steps, low=1, integer=True)
        check_range("refine_gain", refine_gain, low=0, optional=True)
        check_range("refine_after", refine_after, low=1, integer=True)
        check_range("change_tolerance", change_tolerance, low=0)
        self.change_tolerance = change_tolerance
        self.controller = controller
        self.min_sync_steps = min_sync_steps
        self.rollback_tolerance = rollback_tolerance
        self.reject_periods = reject_periods
        self.explore_after = explore_after
        self.refine_gain = refine_gain
        self.refine_after = refine_after
        self._trial: Trial | None = None  # the last applied change, until it is judged
        self._rejected: list[Rejection] = []  # rolled-back moves, until the speeds change
        self._at_floor = [0] * controller.world_size  # adjustments each rank sat at its lower bound
        self._proposed: Proposal | None = None  # the refinement proposed at the last adjustment
        self._left: tuple[int, ...] | None = None  # the split the last applied change left
        self._outcomes: dict[tuple[int, ...], Outcome] = {}  # the synchronous step measured at each split
        self._stint: tuple[tuple[int, ...] | None, Outcome | None] = (None, None)  # the split now run, earlier outcome
        self._stalls = Stalls()  # the smallest size each rank was seen stalling at

    @property
    def on_trial(self) -> bool:
        """Whether the last applied change awaits its judgement."""
        return self._trial is not None

    def decide(
        self,
        current: Sequence[int],
        costs: Sequence[tuple[float, float]],
        sync_step_s: float | None = None,
        known_sizes: Sequence[int] | None = None,
        sync_steps: int | None = None,
        relative_errors: Sequence[float] | None = None,
        speeds_changed: bool = False,
        busy_s: Sequence[float] | None = None,
        wait_s: float | None = None,
    ) -> Decision:
        """Decide from every rank's ``(overhead_s, per_sample_s)`` and the synchronous step measured at ``current``.

        ``known_sizes``: how many distinct batch sizes each rank's cost model rests on (for exploration).
        ``sync_steps``: how many steps ``sync_step_s`` rests on (``None``: enough).
        ``relative_errors``: each rank's relative standard error of its measured level at ``current`` (for
        refinements; ``None``: not known, no noise gate; NaN: unmeasured, no refinement).
        ``speeds_changed``: a rank's cost model saw its speed change since the last adjustment, and ``sync_step_s``
        is the newest period's (forgets the outcomes and rejected moves if the synchronous step at ``current``
        changed too: the evidence against them is gone). ``busy_s``: each rank's mean busy seconds per step at
        ``current``; ``wait_s``: the least median wait of a rank per step there (both for a nudge).

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
        current = tuple(current)
        measured = sync_step_s is not None and (sync_steps is None or sync_steps >= self.min_sync_steps)
        if speeds_changed and measured and self._changed_at(current, sync_step_s):  # type: ignore[arg-type]
            self._rejected, self._outcomes, self._stint, self._stalls = [], {}, (None, None), Stalls()
        else:
            equal = [sum(current) / len(current)] * len(current)  # the fitted step times at the equal share
            self._stalls.note(current, relative_errors, line_times_s(equal, costs))
        self._record(current, sync_step_s if measured else None, sync_steps, restarted=speeds_changed)
        trial, self._trial = self._trial, None
        if trial is not None:
            judged = self._hold(trial, current, sync_steps) or self._rollback(trial, current, costs, sync_step_s)
            if judged is not None:
                return judged
        back = self._back_to_fastest(current, costs)
        if back is not None:
            self._trial = Trial(current, sync_step_s, sync_steps)
            self._left, self._proposed = current, None
            return back
        rates = [1.0 / c for _, c in costs]
        overheads = [a for a, _ in costs]
        balanced = self.controller.decide(current, rates, overheads)
        proposed, reason = balanced.sizes, "balance"
        if self._refine(balanced, current, relative_errors):
            reason = "refine"
        self._count_floor(current)
        if not balanced.apply and reason != "refine":
            explored = self._explore(proposed, known_sizes)
            if explored is not None:
                proposed, reason = explored, "explore"
        apply = proposed != current and not self._ruled_out(proposed, current)
        apply = apply and not self._stalls.fed_by(proposed, current)
        apply = apply and (balanced.apply or reason != "balance")
        tolerance = None
        if not apply:
            nudged = self._nudge(current, costs, busy_s, relative_errors, sync_step_s if measured else None, wait_s)
            if nudged is not None:
                proposed, reason, apply, tolerance = nudged, "nudge", True, self.refine_gain
        if apply:
            self._trial = Trial(current, sync_step_s, sync_steps, tolerance)
            self._left, self._proposed = current, None
        now = step_time_s(current, rates, overheads)
        gain = (now - step_time_s(proposed, rates, overheads)) / now
        return Decision(proposed, gain, apply=apply, reason=reason)

    def _changed_at(self, current: tuple[int, ...], sync_step_s: float) -> bool:
        """Whether the step at ``current`` differs from the one measured there before beyond ``change_tolerance``."""
        before = self._outcomes.get(current)
        return before is not None and abs(math.log(sync_step_s / before.mean_s)) > math.log1p(self.change_tolerance)

    def _record(
        self, current: tuple[int, ...], sync_step_s: float | None, sync_steps: int | None, restarted: bool
    ) -> None:
        """Keep the outcome at ``current``: the figure measured since the split came into force (since the newest
        period, ``restarted``) merged with what earlier stints (and this one before the restart) measured there."""
        split, earlier = self._stint
        if split != current or restarted:
            earlier = self._outcomes.get(current)
            self._stint = (current, earlier)
        if sync_step_s is not None:
            steps = self.min_sync_steps if sync_steps is None else sync_steps
            self._outcomes[current] = Outcome(sync_step_s, steps).merged(earlier)

    def _ruled_out(self, proposed: tuple[int, ...], current: tuple[int, ...]) -> bool:
        """Whether ``proposed`` was measured slower than ``current``, or moves from a rejection's origin its way."""
        moves = (r for r in self._rejected if r.origin == current or r.rejected == proposed)
        return any(r.covers(proposed) for r in moves) or self._measured_slower(proposed, current)

    def _back_to_fastest(self, current: tuple[int, ...], costs: Sequence[tuple[float, float]]) -> Decision | None:
        """Return to the split measured fastest when the one in force measured slower beyond ``rollback_tolerance``
        (both on enough steps: :meth:`Outcome.judges`), or twice ``refine_gain`` once both rest on
        :data:`LONG_STEPS`, unless that split is now inverted."""
        here, enough = self._outcomes.get(current), (self.min_sync_steps, QUOTA_PERIOD_S)
        known = [(o.mean_s, s) for s, o in self._outcomes.items() if s != current and o.judges(*enough)]
        if here is None or not here.judges(*enough) or not known:
            return None
        best_s, best = min(known)
        long = min(here.steps, self._outcomes[best].steps) >= LONG_STEPS and self.refine_gain is not None
        margin = 2 * self.refine_gain if long else self.rollback_tolerance  # type: ignore[operator]
        if here.mean_s <= best_s * (1 + margin) or self._inverted(best, costs):
            return None
        return Decision(best, (here.mean_s - best_s) / here.mean_s, apply=True, reason="return")

    def _nudge(
        self,
        current: tuple[int, ...],
        costs: Sequence[tuple[float, float]],
        busy_s: Sequence[float] | None,
        relative_errors: Sequence[float] | None,
        sync_step_s: float | None,
        wait_s: float | None,
    ) -> tuple[int, ...] | None:
        """One unit from the rank that stalls most (:class:`Stalls`) to the rank measured least busy, when the
        stalls cost time: the synchronous step exceeds the busiest rank's mean busy time plus ``wait_s`` (the least
        median wait of any rank: the all-reduce's share) by more than twice ``refine_gain``. The fitted costs cannot
        say so: a stalling rank's mean busy time misses its stalls."""
        figures = [*(busy_s or []), *(relative_errors or []), sync_step_s, wait_s]
        if busy_s is None or relative_errors is None or self.refine_gain is None:
            return None
        if not all(f is not None and math.isfinite(f) for f in figures):
            return None
        stalling = self._stalls.at(current)
        excess = sync_step_s - max(busy_s) - wait_s  # type: ignore[operator]
        if not stalling or excess <= 2 * self.refine_gain * sync_step_s:  # type: ignore[operator]
            return None
        controller = self.controller
        u, floors, upper = controller.unit, controller.floors, controller.upper
        slow = max(stalling, key=lambda k: relative_errors[k])
        fast = min((k for k in range(len(current)) if k != slow), key=lambda k: busy_s[k], default=slow)
        if slow == fast or current[slow] - u < floors[slow] or current[fast] + u > upper[fast]:
            return None
        proposed = tuple(b - u if k == slow else b + u if k == fast else b for k, b in enumerate(current))
        if self._inverted(proposed, costs) or self._ruled_out(proposed, current):
            return None
        return proposed

    def _inverted(self, split: tuple[int, ...], costs: Sequence[tuple[float, float]]) -> bool:
        """Whether ``split`` gives a slower rank (by the fitted costs at the equal share) more than a faster one."""
        controller = self.controller
        equal_share = controller.global_batch_size / controller.world_size
        speed_times = line_times_s([equal_share] * controller.world_size, costs)
        return order_by_speed(split, speed_times, controller.lower, controller.upper) != split

    def _measured_slower(self, proposed: tuple[int, ...], current: tuple[int, ...]) -> bool:
        """Whether ``proposed`` was measured slower than ``current``."""
        there, here = self._outcomes.get(proposed), self._outcomes.get(current)
        return there is not None and here is not None and proposed != current and there.mean_s > here.mean_s

    def _hold(self, trial: Trial, current: tuple[int, ...], sync_steps: int | None) -> Decision | None:
        """Hold the split until the last change has been measured on ``min_sync_steps`` steps: to judge it, and
        before any new decision (also when a baseline on fewer steps cannot judge it: costs fitted on a step or two
        at a new size moved a right split away under a quota)."""
        if sync_steps is None or sync_steps >= self.min_sync_steps:
            return None
        self._trial = trial  # judge it once the new split has been measured on enough steps
        return Decision(current, 0.0, apply=False, reason="hold")

    def _rollback(
        self,
        trial: Trial,
        current: tuple[int, ...],
        costs: Sequence[tuple[float, float]],
        sync_step_s: float | None,
    ) -> Decision | None:
        """Return to the split before the last change when the step measured since is slower beyond the tolerance,
        unless that split is now inverted (the ranks' speeds changed under it)."""
        if not trial.judges(self.min_sync_steps, QUOTA_PERIOD_S) or trial.before == current:
            return None
        if sync_step_s is None or trial.before_s is None:
            return None
        tolerance = self.rollback_tolerance if trial.tolerance is None else trial.tolerance
        if sync_step_s <= trial.before_s * (1 + tolerance) or self._inverted(trial.before, costs):
            return None
        if self.reject_periods:
            self._reject(trial.before, current)
        self._left, self._proposed = current, None
        return Decision(trial.before, (trial.before_s - sync_step_s) / sync_step_s, apply=True, reason="rollback")

    def _reject(self, origin: tuple[int, ...], rejected: tuple[int, ...]) -> None:
        """Remember a rolled-back move (replacing one from the same origin the same way)."""
        same = [r for r in self._rejected if r.origin == origin and r.covers(rejected)]
        strikes = 1 + max((r.strikes for r in same), default=0)
        self._rejected = [r for r in self._rejected if r not in same]
        self._rejected.append(Rejection(origin, rejected, self.reject_periods, strikes))

    def _refine(self, balanced: Decision, current: tuple[int, ...], relative_errors: Sequence[float] | None) -> bool:
        """Whether to apply a balancing move under the deadband: above ``refine_gain`` and the comparison's noise,
        proposed ``refine_after`` adjustments in a row, and not back to the split the last change left."""
        proposed = balanced.sizes
        refinable = (
            self.refine_gain is not None
            and not balanced.apply
            and proposed != current
            and proposed != self._left
            and balanced.predicted_gain > self.refine_gain
            and balanced.predicted_gain > 2 * math.sqrt(2) * _largest(relative_errors or [0.0])
        )
        last = self._proposed
        in_a_row = last.in_a_row + 1 if refinable and last is not None and last.sizes == proposed else 1
        refine = refinable and in_a_row >= self.refine_after
        self._proposed = Proposal(proposed, in_a_row) if refinable and not refine else None
        return refine

    def _count_floor(self, current: tuple[int, ...]) -> None:
        floors = self.controller.floors
        self._at_floor = [n + 1 if b <= lo else 0 for n, b, lo in zip(self._at_floor, current, floors, strict=True)]

    def _explore(self, proposed: tuple[int, ...], known_sizes: Sequence[int] | None) -> tuple[int, ...] | None:
        """Offer a rank that sat at its lower bound, with its cost known at one size only, one notch more: half its
        floor, in whole multiples of ``batch_size_multiple`` (at least one) taken from the largest rank, so every
        size keeps its remainder modulo the multiple (the global batch's remainder stays on the rank holding it)."""
        controller = self.controller
        floors, upper, m = controller.floors, controller.upper, controller.unit
        explorable = [
            k
            for k in range(controller.world_size)
            if self.explore_after is not None
            and self._at_floor[k] >= self.explore_after
            and proposed[k] <= floors[k]
            and (known_sizes is None or known_sizes[k] <= 1)
        ]
        if not explorable:
            return None
        k = explorable[0]
        donors = [j for j in range(controller.world_size) if j != k and proposed[j] - m >= floors[j]]
        if not donors or proposed[k] + m > upper[k]:
            return None
        donor = max(donors, key=lambda j: (proposed[j], -j))
        notch = max(m, max(1, floors[k] // 2) // m * m)
        step = min(notch, (proposed[donor] - floors[donor]) // m * m, (upper[k] - proposed[k]) // m * m)
        explored = list(proposed)
        explored[k] += step
        explored[donor] -= step
        self._at_floor[k] = 0
        return tuple(explored)

    def state_dict(self) -> dict[str, Any]:
        """The rejected splits, the outcomes, the adjustments at the floor, the pending refinement, the split last
        left and the sizes the ranks were seen stalling at."""
        return {
            "outcomes": [[list(split), o.mean_s, o.steps] for split, o in self._outcomes.items()],
            "rejected": [[list(r.origin), list(r.rejected), r.left, r.strikes] for r in self._rejected],
            "at_floor": self._at_floor,
            "proposed": None if self._proposed is None else [list(self._proposed.sizes), self._proposed.in_a_row],
            "left": None if self._left is None else list(self._left),
            "stalls": [[k, size] for k, size in self._stalls.sizes.items()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (a different world size keeps the floor counts at zero)."""
        self._rejected = [Rejection.saved(entry) for entry in state.get("rejected", [])]
        self._outcomes = {
            tuple(split): Outcome(mean_s, int(steps)) for split, mean_s, steps in state.get("outcomes", [])
        }
        at_floor = list(state.get("at_floor", []))
        if len(at_floor) == self.controller.world_size:
            self._at_floor = at_floor
        proposed = state.get("proposed")
        self._proposed = None if proposed is None else Proposal(tuple(proposed[0]), int(proposed[1]))
        self._left = None if state.get("left") is None else tuple(state["left"])
        self._stalls = Stalls({int(k): int(size) for k, size in state.get("stalls", [])})


def _largest(values: Sequence[float]) -> float:
    """The largest value, infinite if any is NaN (unmeasured)."""
    return max(values) if all(math.isfinite(v) for v in values) else math.inf
