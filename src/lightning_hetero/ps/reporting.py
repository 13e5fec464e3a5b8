"""What ``AsyncPSStrategy`` tells the user: the hyper-parameters ASP uses (once, on rank 0), the momentum and learning
rate in force (``ps/momentum_effective``, ``ps/lr_effective``) and the staleness of updates (``ps/staleness``,
``ps/staleness_max``).

Example::

    >>> print(compensation_message({"lr": 0.1, "momentum": 0.9}, None, None))
    AsyncPSStrategy: ASP uses the optimizer's hyper-parameters as they are (lr 0.1, momentum 0.9); asynchrony_compensation=None
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule

from lightning_hetero.ps.compensation import AsynchronyCompensator, momentum_of

#: how often rank 0 logs the hyper-parameters in force, in its batches (``self.log`` costs tens of microseconds, and
#: rank 0 also serves the other workers)
LOG_EVERY_N_BATCHES = 8


def _rounded(value: float | None) -> str:
    return "None" if value is None else f"{value:.4g}"


def compensation_message(user: dict[str, Any], compensator: AsynchronyCompensator | None, mode: str | None) -> str:
    """Which hyper-parameters the server uses in ASP, given the user's first param group ``user``.

    Args:
        user: the user's first param group.
        compensator: the server's compensator (``None``: the user's values as they are).
        mode: the strategy's ``asynchrony_compensation``.
    """
    if compensator is None:
        return (
            f"AsyncPSStrategy: ASP uses the optimizer's hyper-parameters as they are (lr {user['lr']:g}, "
            f"momentum {momentum_of(user)}); asynchrony_compensation=None"
        )
    return (
        f"AsyncPSStrategy: asynchrony_compensation={mode!r}: in ASP with "
        f"{compensator.n_eff:g} effective workers the server uses momentum "
        f"{_rounded(compensator.momentum_effective)} (yours {momentum_of(user)}) and lr "
        f"{_rounded(compensator.lr_effective)} (yours {user['lr']:g}), updated from the measured staleness "
        "(logged as ps/momentum_effective, ps/lr_effective); BSP uses yours."
    )


def should_log_hyperparameters(batches_started: int, last_batch: bool) -> bool:
    """Rank 0 logs the hyper-parameters in force on its first batch, every :data:`LOG_EVERY_N_BATCHES` after it, and
    on the epoch's last.

    Example::

        >>> [n for n in range(1, 20) if should_log_hyperparameters(n, last_batch=n == 19)]
        [1, 9, 17, 19]
    """
    return batches_started % LOG_EVERY_N_BATCHES == 1 or last_batch


def log_hyperparameters(
    module: LightningModule, group: dict[str, Any], compensator: AsynchronyCompensator | None
) -> None:
    """Log the first param group's momentum and learning rate that updates use: the compensator's in ASP (when it
    is on), else the optimizer's own ``group``."""
    if compensator is not None:
        momentum, lr = compensator.momentum_effective, compensator.lr_effective
    else:
        momentum, lr = momentum_of(group), group["lr"]
    for name, value in (("ps/momentum_effective", momentum), ("ps/lr_effective", lr)):
        if isinstance(value, (int, float)):
            module.log(name, float(value), on_step=False, on_epoch=True, batch_size=1, rank_zero_only=True)


def log_staleness(module: LightningModule, staleness: int) -> None:
    """Log an asynchronous update's staleness (epoch mean and max over every rank's updates). Called at every
    asynchronous step on every rank (each rank trains at least one batch per epoch), so the epoch-end
    synchronisation of these two keys is matched across ranks."""
    value = float(staleness)
    module.log("ps/staleness", value, on_step=False, on_epoch=True, batch_size=1, sync_dist=True)
    module.log("ps/staleness_max", value, on_step=False, on_epoch=True, batch_size=1, sync_dist=True, reduce_fx="max")
