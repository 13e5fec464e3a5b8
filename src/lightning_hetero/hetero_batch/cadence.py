"""When HeteroBatch adjusts inside an epoch: every ``adjust_every_n_steps`` steps if set; by default early in the
first epoch, so that the first split is measured and corrected before the epoch ends, and every
:data:`STEADY_PERIOD` steps inside every epoch, so that a speed change inside a long epoch is followed before its end.

Why early: an adjustment fits each rank's cost (a fixed overhead plus a per-sample cost) on the batch sizes it has
run. The first one has seen one split only, so it cannot tell a rank's overhead from its per-sample cost and lands
a few samples short of the best split (measured under Docker CPU quotas: 104/24 where the best is 106/22 of 128,
the epoch at the short split running at 0.94 of the next). With adjustments at epoch ends only, the second fit came
an epoch later; adjusting early inside the first epoch puts both fits there, and later epochs start at the refined
split.
"""

from __future__ import annotations

from lightning_hetero._validation import check_range

#: the most steps an early adjustment measures before it adjusts (also the adjustment period bench_controller checks)
EARLY_PERIOD = 8
#: the fewest measured steps an early adjustment rests on (the first at a new split is not measured)
EARLY_MIN_PERIOD = 4
#: early adjustments in the first epoch at most (the epoch's end adjusts too)
EARLY_ADJUSTMENTS = 2
#: by default, steps between adjustments inside every epoch (as many as a split's synchronous steps are kept:
#: ``period.SYNC_STEPS_KEPT``); an epoch of at most this many steps adjusts at its end only
STEADY_PERIOD = 32


def early_steps(steps_in_epoch: int, warmup_steps: int) -> tuple[int, ...]:
    """The steps of the first epoch after which HeteroBatch adjusts by default (counted from 1).

    Each early adjustment measures ``period`` steps, at most :data:`EARLY_PERIOD` and at most half of the epoch's
    steps after the warm-up, and leaves at least ``period`` steps before the epoch's end for the split it chose to be
    measured; an epoch too short for a period of :data:`EARLY_MIN_PERIOD` steps adjusts at its end only.

    Example::

        >>> early_steps(16, warmup_steps=3)  # 6 steps at the first split, 7 at the second before the epoch's end
        (9,)
        >>> early_steps(100, warmup_steps=3)
        (11, 19)
        >>> early_steps(10, warmup_steps=3)  # 7 steps after the warm-up: too few for two periods of 4
        ()
    """
    check_range("steps_in_epoch", steps_in_epoch, low=0, integer=True)
    check_range("warmup_steps", warmup_steps, low=0, integer=True)
    period = min(EARLY_PERIOD, (steps_in_epoch - warmup_steps) // 2)
    if period < EARLY_MIN_PERIOD:
        return ()
    steps = (warmup_steps + k * period for k in range(1, EARLY_ADJUSTMENTS + 1))
    return tuple(step for step in steps if step <= steps_in_epoch - period)


def adjusts_after(step: int, steps_in_epoch: int, every: int | None, warmup_steps: int, first_epoch: bool) -> bool:
    """Whether HeteroBatch adjusts after the epoch's ``step``-th step (from 1), short of the epoch's end (which
    always adjusts): every ``every`` steps when set, else at :func:`early_steps` in the first epoch and every
    :data:`STEADY_PERIOD` steps in every epoch.

    Example::

        >>> [s for s in range(1, 17) if adjusts_after(s, 16, every=None, warmup_steps=3, first_epoch=True)]
        [9]
        >>> [s for s in range(1, 17) if adjusts_after(s, 16, every=None, warmup_steps=3, first_epoch=False)]
        []
        >>> [s for s in range(1, 101) if adjusts_after(s, 100, every=None, warmup_steps=3, first_epoch=True)]
        [11, 19, 32, 64, 96]
        >>> [s for s in range(1, 101) if adjusts_after(s, 100, every=None, warmup_steps=3, first_epoch=False)]
        [32, 64, 96]
        >>> [s for s in range(1, 17) if adjusts_after(s, 16, every=4, warmup_steps=3, first_epoch=False)]
        [4, 8, 12]
    """
    if step >= steps_in_epoch:
        return False
    if every is not None:
        return step % every == 0
    return step % STEADY_PERIOD == 0 or (first_epoch and step in early_steps(steps_in_epoch, warmup_steps))


def describe(steps_in_epoch: int, every: int | None, warmup_steps: int, first_epoch: bool, lock_step: bool) -> str:
    """When HeteroBatch adjusts, and why, as the line it prints at the start of a fit: what :func:`adjusts_after`
    does for epochs of ``steps_in_epoch`` steps; ``lock_step``: the strategy's ranks step together inside an epoch
    (``AsyncPSStrategy`` in ASP does not, so there the split changes at epoch ends only).

    Example::

        >>> describe(100, every=None, warmup_steps=3, first_epoch=True, lock_step=True)
        "at every epoch's end, after steps 11 and 19 of this first epoch (to measure its first splits early), and every 32 steps inside epochs of 100 steps (to follow a speed change before an epoch ends)"
        >>> describe(16, every=None, warmup_steps=3, first_epoch=True, lock_step=True)
        "at every epoch's end and after step 9 of this first epoch (to measure its first split early); epochs of 16 steps are too short to adjust every 32 steps inside them"
        >>> describe(16, every=None, warmup_steps=3, first_epoch=False, lock_step=True)  # a resumed run
        "at every epoch's end; epochs of 16 steps are too short to adjust every 32 steps inside them"
        >>> describe(16, every=4, warmup_steps=3, first_epoch=True, lock_step=True)
        "at every epoch's end and every 4 steps inside it (adjust_every_n_steps=4)"
        >>> describe(100, every=4, warmup_steps=3, first_epoch=True, lock_step=False)
        "at every epoch's end (the strategy's ranks do not step together inside an epoch)"
    """
    if not lock_step:
        return "at every epoch's end (the strategy's ranks do not step together inside an epoch)"
    if every is not None:
        return f"at every epoch's end and every {every} steps inside it (adjust_every_n_steps={every})"
    early = early_steps(steps_in_epoch, warmup_steps) if first_epoch else ()
    parts = ["at every epoch's end"]
    if early:
        named, plural = " and ".join(str(step) for step in early), "s" if len(early) > 1 else ""
        parts.append(f"after step{plural} {named} of this first epoch (to measure its first split{plural} early)")
    if steps_in_epoch > STEADY_PERIOD:
        parts.append(
            f"and every {STEADY_PERIOD} steps inside epochs of {steps_in_epoch} steps (to follow a speed "
            "change before an epoch ends)"
        )
        return ", ".join(parts)
    short = f"epochs of {steps_in_epoch} steps are too short to adjust every {STEADY_PERIOD} steps inside them"
    return f"{' and '.join(parts)}; {short}"
