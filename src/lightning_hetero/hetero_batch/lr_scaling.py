"""Opt-in learning-rate scaling for users who change the global batch size.

While the global batch stays constant the learning rate needs no change, whatever the per-rank split. When a user
trains with a global batch different from the one the learning rate was tuned for, the common rules are linear
(Goyal et al.) and square-root (Krizhevsky; Hoffer et al.) scaling.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

LR_SCALING_RULES = ("linear", "sqrt")


def lr_scale_factor(rule: str | None, base_global_batch: int, global_batch: int) -> float:
    """The factor by which to multiply learning rates.

    Example::

        >>> lr_scale_factor("linear", 64, 256), lr_scale_factor("sqrt", 64, 256), lr_scale_factor(None, 64, 256)
        (4.0, 2.0, 1.0)
    """
    if rule is None:
        return 1.0
    if rule not in LR_SCALING_RULES:
        raise ValueError(f"lr_scaling must be one of {LR_SCALING_RULES} or None, got {rule!r}")
    ratio = global_batch / base_global_batch
    return ratio if rule == "linear" else math.sqrt(ratio)


def scale_learning_rates(optimizers: Iterable[Any], schedulers: Iterable[Any], factor: float) -> None:
    """Multiply every param group's ``lr`` (and ``initial_lr``) and every scheduler's ``base_lrs`` by ``factor``.

    Schedulers recompute the learning rate from ``base_lrs``, so scaling only the param groups would be undone at
    the scheduler's next step.

    Example::

        >>> import torch
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        >>> sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
        >>> scale_learning_rates([opt], [sched], 2.0)
        >>> opt.param_groups[0]["lr"], sched.base_lrs
        (0.2, [0.2])
    """
    if factor == 1.0:
        return
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] *= factor
            if "initial_lr" in group:
                group["initial_lr"] *= factor
    for scheduler in schedulers:
        if hasattr(scheduler, "base_lrs"):
            scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]
