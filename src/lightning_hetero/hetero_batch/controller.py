"""The batch-size controller: per-rank batch sizes proportional to measured throughput.

Pure arithmetic with no torch.distributed in it. Every rank feeds it the same all-gathered throughputs and so
reaches the same decision.

Each rank's compute per step is modelled as ``t_k(b) = a_k + b / X_k`` (a fixed overhead ``a_k`` plus samples at
throughput ``X_k``; with ``a_k = 0`` this is OmniLearn's ``b_k ∝ X_k``). The split equalises the predicted step
times (:func:`~lightning_hetero.allocation.apportion`) within each rank's bounds and keeps the global batch exact.

Also the records :class:`~lightning_hetero.hetero_batch.policy.AdjustmentPolicy` keeps about its decisions: a change
on trial (:class:`Trial`), the synchronous step measured at a split (:class:`Outcome`), a rolled-back move
(:class:`Rejection`), a refinement proposed in a row (:class:`Proposal`) and the sizes ranks stall at
(:class:`Stalls`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_hetero._validation import check_range
from lightning_hetero.allocation import apportion, order_by_speed, rate_times_s, step_time_s


@dataclass(frozen=True)
class Decision:
    """The controller's answer: the proposed split, its predicted gain, and whether it is worth applying.

    ``predicted_gain`` is the fraction by which the synchronous step is predicted to shorten (``0.25``: a quarter).
    ``reason`` says why: ``"balance"`` (equalise the predicted step times), ``"refine"`` (a balancing move whose
    predicted gain is under the deadband but was proposed at two adjustments in a row), ``"rollback"`` (the last
    change made the measured synchronous step slower: return to the split before it), ``"explore"`` (try a rank
    that sat at its minimum one notch higher, to learn its cost at another size), ``"hold"`` (keep the split until
    the last change has been measured on enough steps), ``"return"`` (back to the split measured fastest) or
    ``"nudge"`` (one unit away from a rank whose stalls under a CPU quota cost time).
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
        batch_size_multiple: sizes are drawn from multiples of this (tensor cores, and fewer shapes for
            ``torch.compile``); the global batch's remainder modulo it goes to one rank. Bounds that leave no
            split in multiples fall back to single samples.

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
        batch_size_multiple: int = 1,
    ) -> None:
        check_range("world_size", world_size, low=1, integer=True)
        check_range("batch_size_multiple", batch_size_multiple, low=1, integer=True)
        self.multiple = batch_size_multiple
        check_range("global_batch_size", global_batch_size, low=1, integer=True)
        check_range("deadband", deadband, low=0)
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
            check_range(f"min_batch_size (rank {rank})", lo, low=1, integer=True)
            if lo > hi:
                raise ValueError(f"min_batch_size ({lo}) exceeds max_batch_size/memory cap ({hi}) for rank {rank}")
        if sum(self.upper) < global_batch_size:
            raise ValueError(
                f"global_batch_size ({global_batch_size}) exceeds the sum of the per-rank maxima "
                f"({sum(self.upper)}): raise max_batch_size / memory_caps or lower the global batch"
            )

    @property
    def unit(self) -> int:
        """The step sizes move by: ``batch_size_multiple``, or 1 where the bounds leave no split in multiples."""
        m = self.multiple
        units = self.global_batch_size // m
        fits = sum(-(-lo // m) for lo in self.lower) <= units <= sum(hi // m for hi in self.upper)
        return m if fits else 1

    @property
    def floors(self) -> list[int]:
        """Each rank's smallest size: its ``min_batch_size`` rounded up to a multiple of :attr:`unit`.

        Example::

            >>> BatchSizeController(global_batch_size=100, world_size=2, min_batch_size=2, batch_size_multiple=8).floors
            [8, 8]
        """
        u = self.unit
        return [-(-lo // u) * u for lo in self.lower]

    def equal_split(self) -> tuple[int, ...]:
        """The split a plain DDP job would use (equal shares, within the bounds)."""
        return self._split([1.0] * self.world_size)

    def propose(self, throughputs: Sequence[float], overheads_s: Sequence[float] | None = None) -> tuple[int, ...]:
        """The split that equalises predicted step times, ignoring the deadband.

        ``throughputs`` are per-sample rates (samples/s per rank); ``overheads_s`` the fixed per-step costs.
        """
        if len(throughputs) != self.world_size:
            raise ValueError(f"expected {self.world_size} throughputs, got {len(throughputs)}")
        return self._split(throughputs, overheads_s)

    def _split(self, rates: Sequence[float], overheads_s: Sequence[float] | None = None) -> tuple[int, ...]:
        """:func:`apportion` of the global batch, in units of ``batch_size_multiple`` where the bounds allow it.

        Example::

            >>> BatchSizeController(global_batch_size=100, world_size=2, batch_size_multiple=8).propose([3.0, 1.0])
            (76, 24)
        """
        m, total = self.unit, self.global_batch_size
        units, rest = divmod(total, m)
        lower = [-(-lo // m) for lo in self.lower]
        upper = [hi // m for hi in self.upper]
        if m == 1:
            return tuple(apportion(rates, total, self.lower, self.upper, offsets=overheads_s))
        sizes = [u * m for u in apportion([r / m for r in rates], units, lower, upper, offsets=overheads_s)]
        room = [k for k in range(self.world_size) if sizes[k] + rest <= self.upper[k]]
        if not room:
            return tuple(apportion(rates, total, self.lower, self.upper, offsets=overheads_s))
        sizes[max(room, key=lambda k: (rates[k], -k))] += rest
        return tuple(sizes)

    def decide(
        self, current: Sequence[int], throughputs: Sequence[float], overheads_s: Sequence[float] | None = None
    ) -> Decision:
        """Propose a split and say whether its predicted gain over ``current`` clears the deadband.

        The proposal never gives a slower rank (longer predicted step at the equal share) more samples than a
        faster one (:func:`~lightning_hetero.allocation.order_by_speed`).
        """
        proposed = self.propose(throughputs, overheads_s)
        equal_share = self.global_batch_size / self.world_size
        times = rate_times_s([equal_share] * self.world_size, throughputs, overheads_s)
        proposed = order_by_speed(proposed, times, self.lower, self.upper)
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


# The adjustment policy's records (hetero_batch/policy.py): a change on trial, the outcome measured at a split, a
# rolled-back move, a refinement proposed in a row.


#: the CFS quota period (Linux's default): a baseline measured over less may have seen no throttling at all
QUOTA_PERIOD_S = 0.1


@dataclass(frozen=True)
class Trial:
    """An applied change of split, on probation until the synchronous step at the new split has been measured.

    Example::

        >>> trial = Trial(before=(32, 32), before_s=0.128, before_steps=6)
        >>> trial.judges(min_steps=3), Trial((32, 32), 0.128, before_steps=1).judges(min_steps=3)
        (True, False)
    """

    #: the split before the change
    before: tuple[int, ...]
    #: the synchronous step measured at ``before`` (``None``: not measured)
    before_s: float | None
    #: how many steps ``before_s`` rests on (``None``: the caller gives no counts, taken as enough)
    before_steps: int | None
    #: fractional slow-down that rolls the change back (``None``: the policy's ``rollback_tolerance``)
    tolerance: float | None = None

    def judges(self, min_steps: int, min_window_s: float = 0.0) -> bool:
        """Whether the baseline can judge the change: a baseline on fewer steps, or over less than ``min_window_s``
        seconds of them, judges nothing."""
        if self.before_steps is None:
            return True
        return self.before_steps >= min_steps and (self.before_s or 0.0) * self.before_steps >= min_window_s


@dataclass(frozen=True)
class Proposal:
    """A refinement proposed at consecutive adjustments, not yet applied."""

    sizes: tuple[int, ...]
    in_a_row: int


@dataclass(frozen=True)
class Outcome:
    """The synchronous step measured at one split: total wall seconds over steps there (not a per-step median).

    Example::

        >>> Outcome(0.050, 8).merged(Outcome(0.080, 24)).mean_s
        0.0725
    """

    #: mean wall seconds per synchronous step
    mean_s: float
    #: steps it rests on
    steps: int

    def judges(self, min_steps: int, min_window_s: float) -> bool:
        """Whether it rests on at least ``min_steps`` steps over at least ``min_window_s`` seconds."""
        return self.steps >= min_steps and self.mean_s * self.steps >= min_window_s

    def merged(self, other: Outcome | None) -> Outcome:
        """This outcome and ``other`` (an earlier stint at the same split) as one."""
        if other is None:
            return self
        steps = self.steps + other.steps
        return Outcome((self.mean_s * self.steps + other.mean_s * other.steps) / steps, steps)


@dataclass(frozen=True)
class Rejection:
    """A rolled-back change: moves from ``origin`` towards ``rejected`` stay out until a rank's speed measurably
    changes (``left``, ``strikes``: kept for checkpoints of the release before, which waited ``left`` adjustments).

    Example::

        >>> rejection = Rejection(origin=(50, 14), rejected=(42, 22), left=3, strikes=1)
        >>> rejection.covers((44, 20)), rejection.covers((47, 17)), rejection.covers((52, 12))
        (True, True, False)
    """

    #: the split the rollback returned to
    origin: tuple[int, ...]
    #: the split that measured slower
    rejected: tuple[int, ...]
    #: adjustments the move stays out (0: remembered for its strikes, not blocking)
    left: int
    #: rollbacks of this move since the speeds last changed
    strikes: int

    @staticmethod
    def saved(entry: Sequence[Any]) -> Rejection:
        """A rejection from a checkpoint; an older checkpoint's ``[split, left]`` is a move to that split only."""
        if len(entry) == 2:
            split = tuple(entry[0])
            return Rejection(origin=split, rejected=split, left=int(entry[1]), strikes=1)
        origin, rejected, left, strikes = entry
        return Rejection(tuple(origin), tuple(rejected), int(left), int(strikes))

    def covers(self, proposed: Sequence[int]) -> bool:
        """Whether ``proposed`` is the rejected split or moves from the origin the same way (cosine above 1/2)."""
        if tuple(proposed) == self.rejected:
            return True
        move = [b - o for b, o in zip(self.rejected, self.origin, strict=True)]
        other = [b - o for b, o in zip(proposed, self.origin, strict=True)]
        dot = sum(m * o for m, o in zip(move, other, strict=True))
        norms = math.sqrt(sum(m * m for m in move) * sum(o * o for o in other))
        return norms > 0 and dot > 0.5 * norms


@dataclass
class Stalls:
    """The smallest size each rank was seen stalling at. A rank stalls when its busy level varies over ``ratio``
    times the steadiest rank's and by over 5% (relative standard errors): under a CPU quota it runs at full speed
    until the period's budget is spent, then stops, so its mean busy time misses the stalls and its fitted cost
    reads it faster than it is sustained. Still, the fits read a throttled rank slower than a rank with a whole
    CPU: a rank whose fitted step time at the equal share is within ``slower`` times the fastest rank's is not
    taken for stalling (its figures vary for another reason, a shared host; and under a quota the rank can read,
    the throttled rank's level is its CPU time at the quota's rate, the steadiest of all).

    Example::

        >>> stalls = Stalls()
        >>> stalls.note((52, 12), relative_errors=(0.005, 0.15))
        >>> stalls.sizes, stalls.at((52, 12)), stalls.fed_by((50, 14), current=(52, 12)), stalls.at((53, 11))
        ({1: 12}, [1], True, [])
        >>> stalls = Stalls()  # the noisy rank is the fast one: the fits read it 4 times faster
        >>> stalls.note((64, 64), relative_errors=(0.08, 0.001), times_s=(0.05, 0.2))
        >>> stalls.sizes
        {}
    """

    #: rank -> the smallest size it was seen stalling at
    sizes: dict[int, int] = field(default_factory=dict)
    ratio: float = 4.0
    slower: float = 1.5

    def note(
        self,
        current: Sequence[int],
        relative_errors: Sequence[float] | None,
        times_s: Sequence[float] | None = None,
    ) -> None:
        """Remember the ranks stalling at ``current`` (nothing when some error is unmeasured); ``times_s``: each
        rank's fitted step time at the equal share (``None``: every rank may stall)."""
        errors = list(relative_errors or [])
        if not errors or not all(map(math.isfinite, errors)):
            return
        bar = max(self.ratio * min(errors), 0.05)
        fastest = min(times_s) if times_s else 0.0
        for k, (size, error) in enumerate(zip(current, errors, strict=True)):
            if error > bar and (not times_s or times_s[k] > self.slower * fastest):
                self.sizes[k] = min(size, self.sizes.get(k, size))

    def at(self, current: Sequence[int]) -> list[int]:
        """The ranks given at least as many samples as they were seen stalling at."""
        return [k for k, b in enumerate(current) if b >= self.sizes.get(k, b + 1)]

    def fed_by(self, proposed: Sequence[int], current: Sequence[int]) -> bool:
        """Whether ``proposed`` gives a rank more samples than ``current``, as many as it was seen stalling at."""
        return any(b > c and k in self.at(proposed) for k, (b, c) in enumerate(zip(proposed, current, strict=True)))
