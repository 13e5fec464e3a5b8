"""A rank's step cost ``overhead_s + per_sample_s x batch``, fitted robustly from whole adjustment periods.

Each adjustment period a rank reports its *busy* seconds per step (see :class:`~lightning_hetero.measurement.BusyTimer`:
wall time between step starts minus time spent waiting for other ranks) for the batch sizes it ran. Raw steps are
a poor basis for a fit: under a CPU quota they jump by whole throttling periods, and a least-squares line through a
narrow range of sizes then has an arbitrary intercept (which can hand a throttled rank most of the batch). This model
instead

- reduces each period to the **mean busy time of each distinct batch size** (a mean, not a median: a throttle that
  hits one step in four is a real cost that a median would hide, and the mean over a period is the sustained rate),
  merged with the earlier periods at the same size (up to ``memory_steps`` steps), so that a split that stays put
  is measured ever more precisely and a noisy neighbour's occasional stall is averaged out;
- **checks each period against its prediction**: if the model's prediction for the size just run misses the
  period's level (its mean, time-weighted over the period: under a CPU quota per-step times are bimodal, full speed
  until the quota period's budget is spent, then stopped, and their median sees a fast rank whose "speed" then
  changes with its batch size) by more than a factor ``1 + change_tolerance`` either way, the rank's speed changed
  (or the model was wrong), so older sizes are forgotten and the model is rescaled to the new measurement, keeping its overhead
  share (while the overhead is not identified the prediction is the band of every plausible overhead, except right
  after a change, whose period can mix both speeds);
- fits the line through the remembered size means (``max_sizes`` newest distinct sizes, weighted by step counts)
  only when they spread by at least ``min_spread`` of their mean, and keeps the overhead **physically plausible**:
  ``0 <= overhead_s <= max_overhead_share x`` the measured time of the smallest size, with a positive slope.

Pure arithmetic, no torch.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lightning_hetero._validation import check_range


@dataclass(frozen=True)
class PeriodReport:
    """What :meth:`PeriodCostModel.update` concluded from one period."""

    #: the measurement missed the model's prediction by more than the tolerance (a speed change or a bad model)
    changed: bool
    #: median measured / predicted busy time for the newest size, minus 1 (``None`` before the model had any data)
    prediction_error: float | None


class PeriodCostModel:
    """Fits ``t(b) = overhead_s + per_sample_s x b`` over per-size mean busy times of recent adjustment periods.

    Args:
        change_tolerance: a period whose mean busy time is more than ``1 + change_tolerance`` times the prediction,
            or less than ``1 / (1 + change_tolerance)`` of it, resets the remembered sizes to the newest one (and
            rescales the model to it).
        max_sizes: distinct batch sizes remembered for the fit.
        memory_steps: steps remembered per size: a size's mean is merged over periods with this weight cap.
        min_spread: the line is fitted only when the remembered sizes spread by at least this fraction of their
            mean; otherwise the model keeps its overhead share and rescales to the newest measurement.
        max_overhead_share: upper bound of the overhead as a fraction of the smallest size's measured time.

    Example::

        >>> model = PeriodCostModel()
        >>> model.update([(32, 0.010)] * 8)  # one size: no overhead can be told apart yet
        PeriodReport(changed=False, prediction_error=None)
        >>> (model.overhead_s, round(model.per_sample_s, 6))
        (0.0, 0.000313)
        >>> report = model.update([(16, 0.006)] * 8)  # a second size: 2 ms + 0.25 ms/sample
        >>> round(model.overhead_s, 6), round(model.per_sample_s, 6)
        (0.002, 0.00025)
        >>> model.update([(16, 0.024)] * 8).changed  # 4x slower now: older sizes are forgotten, model rescaled
        True
        >>> round(model.overhead_s, 6), round(model.per_sample_s, 6), len(model.sizes)
        (0.008, 0.001, 1)
    """

    def __init__(
        self,
        change_tolerance: float = 0.4,
        max_sizes: int = 4,
        memory_steps: int = 32,
        min_spread: float = 0.1,
        max_overhead_share: float = 0.9,
    ) -> None:
        check_range("change_tolerance", change_tolerance, low=0, low_open=True)
        check_range("min_spread", min_spread, low=0, low_open=True)
        check_range("max_overhead_share", max_overhead_share, low=0, high=1, high_open=True)
        check_range("max_sizes", max_sizes, low=1, integer=True)
        check_range("memory_steps", memory_steps, low=1, integer=True)
        self.memory_steps = memory_steps
        self.change_tolerance = change_tolerance
        self.max_sizes = max_sizes
        self.min_spread = min_spread
        self.max_overhead_share = max_overhead_share
        #: size -> (mean busy seconds, steps), newest last
        self.sizes: dict[int, tuple[float, int]] = {}
        #: size -> variance of one step's busy seconds (pooled within periods, merged like the means)
        self.variances: dict[int, float] = {}
        self.overhead_s = 0.0
        self.per_sample_s: float | None = None
        #: the fit rests on sizes far enough apart to tell the overhead from the per-sample cost
        self.identified = False
        #: the last period reported (or followed another rank's) change of speed
        self._restarted = False
        #: the newest period's (size means, variances, most-run size, overhead share before it), for
        #: restart_from_latest
        self._latest: tuple[dict[int, tuple[float, int]], dict[int, float], int, float] | None = None

    @property
    def ready(self) -> bool:
        return self.per_sample_s is not None

    def step_time_s(self, batch: int) -> float:
        """Predicted busy seconds of a step of ``batch`` samples."""
        if self.per_sample_s is None:
            raise ValueError("no measurement yet")
        return self.overhead_s + self.per_sample_s * batch

    def update(self, steps: Iterable[tuple[int, float] | tuple[int, float, float]]) -> PeriodReport:
        """Fold one period's ``(batch size, busy seconds[, floor seconds])`` steps into the model.

        Until the overhead is identified, a period at a new size is checked against the band of plausible
        overheads (:meth:`_plausible_s`), except right after a change of speed (the period that saw it may mix
        both speeds), where the point prediction decides.

        The optional floor is a lower bound on the step's sustained cost (its CPU time at a CPU quota's rate): a
        size's level is ``max(mean busy, mean floor)``. Means over the period, not per-step maxima: a rank that
        limits the step pays its quota's debt in a few long throttled steps, and those already make the mean busy
        time equal its mean floor. The check for a speed change compares that level with the prediction too (a
        median step missed the throttled steps under a quota and reported a change after nearly every move).
        """
        busy: dict[int, list[float]] = {}
        floors: dict[int, list[float]] = {}
        for size, busy_s, *floor in steps:
            if size > 0 and math.isfinite(busy_s) and busy_s > 0:
                busy.setdefault(size, []).append(busy_s)
                floors.setdefault(size, []).append(floor[0] if floor and math.isfinite(floor[0]) else 0.0)
        if not busy:
            return PeriodReport(changed=False, prediction_error=None)
        means = {
            size: (max(sum(times) / len(times), sum(floors[size]) / len(times)), len(times))
            for size, times in busy.items()
        }
        # the variance of what the level is the mean of: under a quota the floor (CPU time at the quota's rate) is
        # smooth while busy times jump by whole throttling periods, and the level of a rank that does not limit the
        # step is its mean floor, known as precisely as its CPU time
        variances = {
            size: _variance(floors[size] if means[size][0] > sum(times) / len(times) else times)
            for size, times in busy.items()
        }
        newest = max(means, key=lambda size: means[size][1])  # the size most of the period ran at
        error = None
        changed = False
        if self.ready:
            predicted = self.step_time_s(newest)
            typical = means[newest][0]
            error = typical / predicted - 1
            # right after a change the model rests on the period that saw it, which can mix both speeds: there a
            # miss is a miss (the band would let the mixed level and the next size make a line of nonsense)
            low, high = (predicted, predicted) if self._restarted else self._plausible_s(newest)
            tolerance = 1 + self.change_tolerance
            changed = typical > high * tolerance or typical < low / tolerance
        share = self.overhead_s / self.step_time_s(newest) if self.ready else 0.0
        self._latest = (means, variances, newest, share)
        self._restarted = changed
        if changed:
            self.sizes = {}
        for size in sorted(means, key=lambda size: size == newest):
            mean_s, count = means[size]
            old_mean_s, old_count = self.sizes.pop(size, (0.0, 0))
            kept = min(old_count, max(0, self.memory_steps - count))
            self.sizes[size] = (
                (kept * old_mean_s + count * mean_s) / (kept + count),
                min(kept + count, self.memory_steps),
            )
            old_variance = self.variances.get(size, 0.0) if old_count else 0.0
            self.variances[size] = (kept * old_variance + count * variances[size]) / (kept + count)
        while len(self.sizes) > self.max_sizes:
            del self.sizes[next(iter(self.sizes))]
        self.variances = {size: self.variances[size] for size in self.sizes}
        self._refit(newest, share)
        return PeriodReport(changed=changed, prediction_error=error)

    def restart_from_latest(self) -> None:
        """Forget everything but the newest period, as if it had reported a change.

        For a change seen by *another* rank: a load spike on a shared host or a schedule that changes several
        ranks at once would otherwise leave this rank's model averaged over older periods while the other's
        reflects only the newest one, and their ratio, which decides the split, would be wrong. Restarting every
        rank together keeps all models on the same time window.

        Example::

            >>> model = PeriodCostModel()
            >>> _ = model.update([(32, 0.010)] * 8)
            >>> _ = model.update([(32, 0.013)] * 8)  # within the tolerance: merged with the first period
            >>> round(model.step_time_s(32), 4)
            0.0115
            >>> model.restart_from_latest()
            >>> round(model.step_time_s(32), 4)
            0.013
        """
        if self._latest is None:
            return
        means, variances, newest, share = self._latest
        self.sizes = {size: means[size] for size in sorted(means, key=lambda size: size == newest)}
        self.variances = dict(variances)
        self._refit(newest, share)
        self._restarted = True

    def relative_error(self, batch: int) -> float:
        """The standard error of the level measured at ``batch`` (its mean busy time, or under a quota its mean floor
        when that is higher), as a fraction of that level (NaN when ``batch`` was not measured): how far apart two
        ranks' levels can look by chance.

        Example::

            >>> model = PeriodCostModel()
            >>> _ = model.update([(32, 0.009), (32, 0.011)] * 4)  # 10% spread per step, 8 steps
            >>> round(model.relative_error(32), 4), math.isnan(model.relative_error(16))
            (0.0354, True)
            >>> _ = model.update([(32, 0.009), (32, 0.011)] * 4)  # twice the steps at the same size
            >>> round(model.relative_error(32), 4)
            0.025
        """
        if batch not in self.sizes:
            return math.nan
        mean_s, count = self.sizes[batch]
        return math.sqrt(self.variances.get(batch, 0.0) / count) / mean_s

    def latest_fit(self) -> tuple[float, float | None, int]:
        """``(overhead_s, per_sample_s, sizes)`` as :meth:`restart_from_latest` would leave them, without restarting.

        Lets every rank send both fits in one exchange, so that a change seen by any rank needs no second one.

        Example::

            >>> model = PeriodCostModel()
            >>> _ = model.update([(32, 0.010)] * 8)
            >>> _ = model.update([(32, 0.013)] * 8)
            >>> fit = model.latest_fit()
            >>> round(fit[1] * 32, 4), round(model.step_time_s(32), 4)  # the newest period alone; the model unchanged
            (0.013, 0.0115)
        """
        if self._latest is None:
            return self.overhead_s, self.per_sample_s, len(self.sizes)
        trial = copy.copy(self)
        trial.restart_from_latest()
        return trial.overhead_s, trial.per_sample_s, len(trial.sizes)

    def _plausible_s(self, batch: int) -> tuple[float, float]:
        """The busy times at ``batch`` that need no change of speed to explain.

        With an identified fit, its prediction. Otherwise the overhead is unknown (one size measured, or sizes too
        close): every line through the measured level with an overhead from 0 to ``max_overhead_share`` of it is
        as plausible, so a move to a distant size that lands between them is information about the overhead, not
        a change of speed (treating it as one would discard the sizes the fit needs, and a rank with a large
        overhead would take several more periods to reach its balanced batch).
        """
        predicted = self.step_time_s(batch)
        if self.identified or not self.sizes:
            return predicted, predicted
        weight = sum(count for _, count in self.sizes.values())
        anchor = sum(size * count for size, (_, count) in self.sizes.items()) / weight
        level = self.overhead_s + self.per_sample_s * anchor if self.per_sample_s is not None else predicted
        proportional = level * batch / anchor
        fixed = level * (self.max_overhead_share + (1 - self.max_overhead_share) * batch / anchor)
        return min(proportional, fixed, predicted), max(proportional, fixed, predicted)

    def _refit(self, newest: int, share: float) -> None:
        self.identified = self._fit()
        if not self.identified:
            # One size (or sizes too close to tell an intercept): keep the overhead's share, rescale to the newest,
            # within the plausible ceiling (a smaller size remembered at a lower level bounds it too).
            mean_s = self.sizes[newest][0]
            self.overhead_s = min(share * mean_s, self.max_overhead_share * self.sizes[min(self.sizes)][0])
            self.per_sample_s = (mean_s - self.overhead_s) / newest

    def _fit(self) -> bool:
        points = [(size, mean_s, count) for size, (mean_s, count) in self.sizes.items()]
        weight = sum(count for _, _, count in points)
        mean_b = sum(b * n for b, _, n in points) / weight
        if len(points) < 2 or (max(b for b, _, _ in points) - min(b for b, _, _ in points)) / mean_b < self.min_spread:
            return False
        mean_t = sum(t * n for _, t, n in points) / weight
        var_b = sum(n * (b - mean_b) ** 2 for b, _, n in points)
        slope = sum(n * (b - mean_b) * (t - mean_t) for b, t, n in points) / var_b
        intercept = mean_t - slope * mean_b
        smallest = min(points)
        ceiling = self.max_overhead_share * smallest[1]
        if slope <= 0 or intercept < 0:
            intercept = 0.0
        intercept = min(intercept, ceiling)
        # least squares of the slope with the intercept held at its plausible value
        slope = sum(n * (t - intercept) * b for b, t, n in points) / sum(n * b * b for b, _, n in points)
        if slope <= 0:
            return False
        self.overhead_s, self.per_sample_s = intercept, slope
        return True

    def state_dict(self) -> dict[str, Any]:
        return {
            "overhead_s": self.overhead_s,
            "per_sample_s": self.per_sample_s,
            "sizes": [[size, mean_s, count] for size, (mean_s, count) in self.sizes.items()],
            "variances": [[size, variance] for size, variance in self.variances.items()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.overhead_s, self.per_sample_s = state["overhead_s"], state["per_sample_s"]
        self.sizes = {int(size): (float(mean_s), int(count)) for size, mean_s, count in state.get("sizes", [])}
        self.variances = {int(size): float(v) for size, v in state.get("variances", [])}
        fitted = self.overhead_s, self.per_sample_s
        self.identified = bool(self.sizes) and self._fit()
        self.overhead_s, self.per_sample_s = fitted


def _variance(values: list[float]) -> float:
    """Population variance in plain floats (``statistics.pvariance`` computes in exact fractions: slower)."""
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)
