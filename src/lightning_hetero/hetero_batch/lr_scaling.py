"""Opt-in learning-rate scaling for users who change the global batch size.

While the global batch stays constant the learning rate needs no change, whatever the per-rank split. When a user
trains with a global batch different from the one the learning rate was tuned for, the common rules are linear
(Goyal et al.) and square-root (Krizhevsky; Hoffer et al.) scaling.
"""

from __future__ import annotations

import math

from lightning_hetero.param_groups import scale_learning_rates as scale_learning_rates  # re-exported for the callback

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
        raise ValueError(f"batch_lr_scaling must be one of {LR_SCALING_RULES} or None, got {rule!r}")
    ratio = global_batch / base_global_batch
    return ratio if rule == "linear" else math.sqrt(ratio)
