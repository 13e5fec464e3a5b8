"""A local-SGD round's length and each rank's local steps in it (pure arithmetic; :mod:`~lightning_hetero.local_sgd.rounds`
runs the rounds).

A round's length (``round_length``) is local steps per rank on average, a budget of samples over all ranks, or of
seconds (:func:`parse_round_length`), split into local steps per rank in proportion to their measured throughputs
(``local_steps="proportional"``) or equally (``"equal"``, DiLoCo).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lightning_hetero._validation import check_range
from lightning_hetero.allocation import apportion

#: How the ranks' local steps in a round are set.
LOCAL_STEPS = ("proportional", "equal")

#: ``round_length``'s spellings besides an int of steps: ``"30s"``, ``"2.5 s"``, ``"2048 samples"``
_UNITS = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(s|samples)\s*")


def check_local_steps(local_steps: str) -> None:
    """Fail naming the setting unless ``local_steps`` is one of :data:`LOCAL_STEPS`."""
    if local_steps not in LOCAL_STEPS:
        raise ValueError(f"local_steps must be one of {LOCAL_STEPS}, got {local_steps!r}")


@dataclass(frozen=True)
class RoundBudget:
    """How long a round lasts: ``samples`` over all ranks, ``seconds`` of wall-clock time, or ``steps``, local steps
    per rank on average (exactly one of them; :meth:`in_samples` turns steps into samples once the batch is known).

    Example::

        >>> RoundBudget(samples=2048)
        RoundBudget(samples=2048, seconds=None, steps=None)
        >>> RoundBudget(samples=0)
        Traceback (most recent call last):
        ...
        ValueError: round_length must be an integer >= 1, got 0
    """

    samples: int | None = None
    seconds: float | None = None
    steps: int | None = None

    def __post_init__(self) -> None:
        given = [value for value in (self.samples, self.seconds, self.steps) if value is not None]
        if len(given) != 1:
            raise ValueError(f"give round_length as exactly one of steps, seconds and samples, got {self!r}")
        if self.seconds is not None:
            check_range("round_length", self.seconds, low=0, low_open=True)
        else:
            check_range("round_length", given[0], low=1, integer=True)

    def in_samples(self, world_size: int, batch_size: int) -> RoundBudget:
        """This budget with ``steps`` turned into samples over all ranks (``steps x world_size x batch_size``).

        Example::

            >>> RoundBudget(steps=16).in_samples(world_size=2, batch_size=32)
            RoundBudget(samples=1024, seconds=None, steps=None)
        """
        return self if self.steps is None else RoundBudget(samples=self.steps * world_size * batch_size)

    def describe(self, world_size: int) -> str:
        """The round's length in words, for the start-up line.

        Example::

            >>> RoundBudget(steps=16).describe(2), RoundBudget(seconds=2.5).describe(2)
            ('16 x 2 batches', '2.5 s')
        """
        if self.steps is not None:
            return f"{self.steps} x {world_size} batches"
        return f"{self.samples} samples" if self.samples is not None else f"{self.seconds:g} s"


def parse_round_length(length: int | str) -> RoundBudget:
    """``round_length`` as a budget: an int is local steps per rank on average, ``"<T>s"`` seconds and
    ``"<N> samples"`` samples over all ranks.

    Raises:
        ValueError: naming ``round_length``, for any other spelling or a value out of range.

    Example::

        >>> parse_round_length(16), parse_round_length("30s"), parse_round_length("2048 samples")
        (RoundBudget(samples=None, seconds=None, steps=16), RoundBudget(samples=None, seconds=30.0, steps=None), RoundBudget(samples=2048, seconds=None, steps=None))
        >>> parse_round_length("30 min")
        Traceback (most recent call last):
        ...
        ValueError: round_length must be local steps per rank (an int), '<seconds>s' or '<count> samples', got '30 min'
    """
    if not isinstance(length, str):
        return RoundBudget(steps=length)
    match = _UNITS.fullmatch(length)
    if match is None:
        raise ValueError(
            f"round_length must be local steps per rank (an int), '<seconds>s' or '<count> samples', got {length!r}"
        )
    value, unit = match.groups()
    if unit == "s":
        return RoundBudget(seconds=float(value))
    return RoundBudget(samples=int(value) if value.isdigit() else float(value))  # type: ignore[arg-type]


def plan_local_steps(
    budget: RoundBudget, batch_size: int, rates: list[float | None], local_steps: str = "proportional"
) -> list[int]:
    """Each rank's number of local steps in the next round (at least one each).

    Args:
        budget: the round's length.
        batch_size: samples per local step (the loader's batch size, the same on every rank).
        rates: each rank's measured samples per second (``None`` while unknown).
        local_steps: ``"proportional"`` to the rates, or ``"equal"``.

    While any rate is unknown every rank gets the same number of steps (for a time budget, one step: the first
    rounds measure).

    Example::

        >>> budget = RoundBudget(samples=640)  # 20 batches of 32 over all ranks
        >>> plan_local_steps(budget, 32, [300.0, 100.0]), plan_local_steps(budget, 32, [300.0, 100.0], "equal")
        ([15, 5], [10, 10])
        >>> plan_local_steps(RoundBudget(seconds=0.5), 32, [320.0, 64.0])  # steps that fill half a second
        [5, 1]
        >>> plan_local_steps(RoundBudget(seconds=0.5), 32, [320.0, 64.0], "equal")  # the same total, split evenly
        [3, 3]
    """
    check_local_steps(local_steps)
    check_range("batch_size", batch_size, low=0, low_open=True)
    n = len(rates)
    known = [float(r) for r in rates if r is not None and r > 0]
    if len(known) < n:
        if budget.samples is None:
            return [1] * n
        return [max(1, round(budget.samples / batch_size / n))] * n
    if budget.samples is not None:
        total = max(n, round(budget.samples / batch_size))
    else:
        total = max(n, sum(round(budget.seconds * rate / batch_size) for rate in known))
    if local_steps == "equal":
        return [max(1, round(total / n))] * n
    return apportion(known, total, lower=[1] * n, upper=[total] * n)
