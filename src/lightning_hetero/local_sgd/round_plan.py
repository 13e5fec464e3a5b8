"""A local-SGD round's length and each rank's local steps in it (pure arithmetic; :mod:`~lightning_hetero.local_sgd.rounds`
runs the rounds).

A round is a budget of samples over all ranks (``round_samples``) or of seconds (``round_s``), split into local
steps per rank in proportion to their measured throughputs (``local_steps="proportional"``) or equally
(``"equal"``, DiLoCo).
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_hetero._validation import check_range
from lightning_hetero.allocation import apportion

#: How the ranks' local steps in a round are set.
LOCAL_STEPS = ("proportional", "equal")


def check_local_steps(local_steps: str) -> None:
    """Fail naming the setting unless ``local_steps`` is one of :data:`LOCAL_STEPS`."""
    if local_steps not in LOCAL_STEPS:
        raise ValueError(f"local_steps must be one of {LOCAL_STEPS}, got {local_steps!r}")


@dataclass(frozen=True)
class RoundBudget:
    """How long a round lasts: ``samples`` over all ranks, or ``seconds`` of wall-clock time (exactly one of them).

    Example::

        >>> RoundBudget(samples=2048)
        RoundBudget(samples=2048, seconds=None)
        >>> RoundBudget(samples=0)
        Traceback (most recent call last):
        ...
        ValueError: round_samples must be an integer >= 1, got 0
    """

    samples: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if (self.samples is None) == (self.seconds is None):
            raise ValueError(
                f"give exactly one of round_samples and round_s, got round_samples={self.samples!r}, "
                f"round_s={self.seconds!r}"
            )
        if self.samples is not None:
            check_range("round_samples", self.samples, low=1, integer=True)
        if self.seconds is not None:
            check_range("round_s", self.seconds, low=0, low_open=True)


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
