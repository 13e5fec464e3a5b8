"""Reading and rewriting optimizer param groups' hyper-parameters: the one copy of what HeteroBatch's LR scaling,
SyncSwitch's per-phase hyper-parameters and the parameter server's asynchrony compensation all do to them.

Pure functions over ``optimizer.param_groups`` (dicts) and LR schedulers: no Trainer, no torch.distributed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def hyperparameters(group: dict[str, Any]) -> dict[str, Any]:
    """A param group's hyper-parameters: every entry but ``params``.

    Example::

        >>> hyperparameters({"params": [1, 2], "lr": 0.1, "momentum": 0.9})
        {'lr': 0.1, 'momentum': 0.9}
    """
    return {key: value for key, value in group.items() if key != "params"}


def momentum_key(group: dict[str, Any]) -> str | None:
    """Where a param group keeps its momentum: ``"momentum"`` (SGD), ``"betas"`` (Adam's first beta) or ``None``."""
    if "momentum" in group:
        return "momentum"
    if "betas" in group:
        return "betas"
    return None


def momentum_of(group: dict[str, Any]) -> float | None:
    """A param group's momentum (``momentum``, or ``betas[0]``), ``None`` when it has neither.

    Example::

        >>> momentum_of({"momentum": 0.9}), momentum_of({"betas": (0.8, 0.999)}), momentum_of({"lr": 0.1})
        (0.9, 0.8, None)
    """
    key = momentum_key(group)
    if key is None:
        return None
    return float(group["momentum"] if key == "momentum" else group["betas"][0])


def set_momentum(group: dict[str, Any], value: float) -> None:
    """Set a param group's momentum (``momentum``, or ``betas[0]``); a group with neither is left alone.

    Example::

        >>> group = {"betas": (0.9, 0.999)}
        >>> set_momentum(group, 0.5)
        >>> group
        {'betas': (0.5, 0.999)}
    """
    key = momentum_key(group)
    if key == "momentum":
        group["momentum"] = value
    elif key == "betas":
        group["betas"] = (value, *tuple(group["betas"])[1:])


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
