"""The batch-size controller: per-rank batch sizes proportional to measured throughput.

Pure arithmetic with no torch.distributed in it. Every rank feeds it the same all-gathered throughputs and so
reaches the same decision.

Each rank's compute per step is modelled as ``t_k(b) = a_k + b / X_k`` (a fixed overhead ``a_k`` plus samples at
throughput ``X_k``; with ``a_k = 0`` this is OmniLearn's ``b_k ∝ X_k``). The split equalises the predicted step
times (:func:`~lightning_hetero.allocation.apportion`) within each rank's bounds and keeps the global batch exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lightning_hetero._validation import check_range
from lightning_hetero.allocation import apportion, order_by_speed, rate_times_s, step_time_s


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
