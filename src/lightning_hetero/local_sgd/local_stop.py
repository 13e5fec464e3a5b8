"""Local SGD stopping at ``max_steps`` exactly: the ranks' local steps all count (``trainer.global_step`` is their
sum), and a rank learns the others' only at a round's end, so the rounds near the budget are planned in steps rather
than by a deadline: once fewer than two rounds' steps are left, a round is a count split among the ranks (by their
speeds with ``local_steps="proportional"``), and the last one is exactly what is left, possibly none for a slow rank.
Every round still ends with the round-end average, so every rank finishes at the budget with the same parameters;
after it a rank trains nothing more (its remaining batches of the epoch run forward and backward but take no step,
until the closed pool runs dry) and meets the others at the epoch's end.

Example: 10 steps left, rounds of 8 by speeds 3:1, then the last 2::

    >>> budgeted_plan([6, 2], [300.0, 100.0], steps_left=10, proportional=True)
    [6, 2]
    >>> budgeted_plan([6, 2], [300.0, 100.0], steps_left=2, proportional=True)
    [2, 0]
    >>> budgeted_plan([6, 2], [None, None], steps_left=3, proportional=True), budgeted_plan([6, 2], [1, 1], 0, False)
    ([2, 1], [0, 0])
    >>> budgeted_plan([6, 2], [300.0, 100.0], steps_left=None, proportional=True) is None  # no max_steps
    True
"""

from __future__ import annotations

from lightning_hetero.allocation import apportion


def budgeted_plan(
    plan: list[int], rates: list[float | None], steps_left: int | None, proportional: bool
) -> list[int] | None:
    """The ranks' local steps in a round planned as ``plan`` when ``steps_left`` steps remain before ``max_steps``:
    ``None`` (the plan as it is, a deadline allowed) while two rounds or more are left, else a count of
    ``min(steps_left, sum(plan))`` steps split by ``rates`` (equally while a rate is unknown or with
    ``proportional=False``).

    Args:
        plan: the round's planned steps per rank.
        rates: the ranks' measured throughputs (``None`` while unknown).
        steps_left: ``max_steps`` less the steps taken (``None``: no ``max_steps``).
        proportional: ``local_steps="proportional"``.
    """
    if steps_left is None or steps_left >= 2 * sum(plan):
        return None
    total, n = max(0, min(steps_left, sum(plan))), len(plan)
    if proportional and all(rate is not None and rate > 0 for rate in rates):
        return apportion([float(rate) for rate in rates], total, lower=[0] * n, upper=[total] * n)  # type: ignore[arg-type]
    return [total // n + (1 if rank < total % n else 0) for rank in range(n)]
