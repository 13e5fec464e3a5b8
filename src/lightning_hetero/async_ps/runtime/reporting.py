"""What ``AsyncPSStrategy`` tells the user: the hyper-parameters ASP uses (once, on rank 0), the momentum and learning
rate in force (``ps/momentum_effective``, ``ps/lr_effective``) and the staleness of updates (``ps/staleness``,
``ps/staleness_max``).

Example::

    >>> sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1, momentum=0.9)
    >>> print(compensation_message(sgd, None, None))
    AsyncPSStrategy: ASP uses the optimizer's hyper-parameters as they are (lr 0.1, momentum 0.9); asynchrony_compensation=None.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from lightning_hetero.asp.compensation import AsynchronyCompensator, momentum_of


def _rounded(value: float | None) -> str:
    return "None" if value is None else f"{value:.4g}"


def compensation_message(
    optimizer: torch.optim.Optimizer, compensator: AsynchronyCompensator | None, mode: str | None
) -> str:
    """Which hyper-parameters the server uses in ASP, given the user's ``optimizer``.

    Args:
        optimizer: the user's optimizer (its first param group is reported).
        compensator: the server's compensator (``None``: the user's values as they are).
        mode: the server's compensation mode.
    """
    user = optimizer.param_groups[0]
    if compensator is not None and not compensator.heavy_ball:
        return (
            f"AsyncPSStrategy: asynchrony_compensation={mode!r}: in ASP the server uses {type(optimizer).__name__}'s "
            f"own momentum {momentum_of(user)} and lr {_rounded(compensator.lr_effective)} (yours {user['lr']:g}, "
            "over the square root of the training workers: each update takes one worker's batch); BSP uses yours."
        )
    if compensator is None:
        return (
            f"AsyncPSStrategy: ASP uses the optimizer's hyper-parameters as they are (lr {user['lr']:g}, "
            f"momentum {momentum_of(user)}); asynchrony_compensation=None."
        )
    return (
        f"AsyncPSStrategy: asynchrony_compensation={mode!r}: in ASP with "
        f"{compensator.n_eff:g} effective workers the server uses momentum "
        f"{_rounded(compensator.momentum_effective)} (yours {momentum_of(user)}) and lr "
        f"{_rounded(compensator.lr_effective)} (yours {user['lr']:g}), updated from the measured staleness "
        "(logged as ps/momentum_effective, ps/lr_effective); BSP uses yours."
    )


def round_trip_message(overlap: bool) -> str:
    """How ASP's workers wait for the server, appended to :func:`compensation_message` (one line at start).

    Example::

        >>> round_trip_message(False)
        " Each worker waits for the server's reply (overlap_round_trip=False: textbook ASP)."
    """
    if overlap:
        return (
            " The round trip overlaps the next batch (overlap_round_trip=True: off the critical path, one own update "
            "of extra staleness, counted above); False, the default: textbook ASP."
        )
    return " Each worker waits for the server's reply (overlap_round_trip=False: textbook ASP)."


class EpochMean(Metric):
    """The mean of the numbers given to :meth:`update` since the last reset (over every rank's, when synchronised).

    Example::

        >>> mean = EpochMean()
        >>> for value in (1, 2, 6):
        ...     mean.update(value)
        >>> float(mean.compute())
        3.0
    """

    full_state_update = False
    total: Tensor
    count: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, value: float) -> None:
        self.total.add_(value)  # in place: rebinding the state would go through Metric.__setattr__
        self.count.add_(1)

    def compute(self) -> Tensor:
        return (self.total / self.count).float()


class EpochMax(Metric):
    """The largest number given to :meth:`update` since the last reset (over every rank's, when synchronised).

    Example::

        >>> largest = EpochMax()
        >>> for value in (1, 5, 2):
        ...     largest.update(value)
        >>> float(largest.compute())
        5.0
    """

    full_state_update = False
    largest: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("largest", torch.tensor(float("-inf"), dtype=torch.float64), dist_reduce_fx="max")

    def update(self, value: float) -> None:
        self.largest.clamp_(min=value)

    def compute(self) -> Tensor:
        return self.largest.float()


#: a strategy's all-gather: a tensor in, every rank's stacked along a new first dimension out
Gather = Callable[[Tensor], Tensor]


class EpochLog:
    """Numbers reported at every training step, logged as epoch statistics for a few microseconds a step.

    Calling ``LightningModule.log`` at every step costs a noticeable share of a short ASP step (docs/results.md,
    ``benchmarks/scenarios/log_cost.py``). Here each number goes into a torchmetrics :class:`~torchmetrics.Metric` (:class:`EpochMean` or :class:`EpochMax`), and the metric itself is handed to
    ``log`` once an epoch, on the rank's first report of it; Lightning computes it at the epoch's end, on every
    rank, and resets it. A synchronised metric gathers its state through ``gather`` (the strategy's
    ``all_gather``, so the strategy's collective rules apply), so every rank that reports a name in an epoch must
    report it at least once in that epoch, as with ``self.log(..., sync_dist=True)``.

    Example (outside a Trainer the log calls only record)::

        >>> calls = []
        >>> class Module:
        ...     def log(self, name, value, **kwargs):
        ...         calls.append((name, kwargs["rank_zero_only"]))
        >>> log = EpochLog(gather=lambda tensor: tensor.unsqueeze(0))
        >>> for staleness in (0, 3, 3):
        ...     log.report(Module(), "ps/staleness", staleness, epoch=0)
        >>> calls, float(log.metric("ps/staleness").compute())
        ([('ps/staleness', False)], 2.0)
    """

    def __init__(self, gather: Gather) -> None:
        self._gather = gather
        self._metrics: dict[str, Metric] = {}
        self._logged_in: dict[str, int] = {}

    def report(
        self, module: Any, name: str, value: float, epoch: int, reduce: str = "mean", synchronised: bool = True
    ) -> None:
        """Add ``value`` to ``name``'s statistic (``reduce``: ``"mean"`` or ``"max"``) of ``epoch``; an
        unsynchronised statistic is the reporting rank's alone (``rank_zero_only``)."""
        metric = self._metrics.get(name)
        if metric is None:
            kind = EpochMax if reduce == "max" else EpochMean
            # ``gather`` decides whether there is anything to gather (a strategy's ``all_gather`` returns the tensor
            # alone outside a distributed run)
            sync = (
                {"dist_sync_fn": self._sync, "distributed_available_fn": lambda: True}
                if synchronised
                else {"sync_on_compute": False}
            )
            metric = self._metrics[name] = kind(**sync)
        if self._logged_in.get(name) != epoch:
            self._logged_in[name] = epoch
            module.log(
                name, metric, on_step=False, on_epoch=True, metric_attribute=name, rank_zero_only=not synchronised
            )
        metric.update(value)

    def metric(self, name: str) -> Metric:
        """The statistic reported as ``name``."""
        return self._metrics[name]

    def restart(self) -> None:
        """Forget the statistics (at the start of a fit: an interrupted fit's epoch was never computed and reset)."""
        for metric in self._metrics.values():
            metric.reset()
        self._logged_in.clear()

    def _sync(self, tensor: Tensor, group: Any = None) -> list[Tensor]:
        gathered = self._gather(tensor).to(tensor.device)
        return list(gathered.reshape(-1, *tensor.shape).unbind(0))


def report_hyperparameters(
    log: EpochLog, module: Any, group: dict[str, Any], compensator: AsynchronyCompensator | None, epoch: int
) -> None:
    """Report the first param group's momentum and learning rate that updates use (``ps/momentum_effective``,
    ``ps/lr_effective``, rank 0's, epoch means over its steps): the compensator's in ASP (when it is on), else the
    optimizer's own ``group``. A value that is not a number (an optimizer without momentum) is not reported."""
    if compensator is not None:
        momentum, lr = compensator.momentum_effective, compensator.lr_effective
    else:
        momentum, lr = momentum_of(group), group["lr"]
    for name, value in (("ps/momentum_effective", momentum), ("ps/lr_effective", lr)):
        if isinstance(value, (int, float)):
            log.report(module, name, float(value), epoch, synchronised=False)


def report_staleness(log: EpochLog, module: Any, staleness: int, epoch: int) -> None:
    """Report an asynchronous update's staleness: ``ps/staleness`` (the epoch's mean over every rank's updates) and
    ``ps/staleness_max``. Called at every asynchronous step on every rank (each rank trains at least one batch per
    epoch), so every rank takes part in the epoch-end synchronisation of these two names."""
    log.report(module, "ps/staleness", float(staleness), epoch)
    log.report(module, "ps/staleness_max", float(staleness), epoch, reduce="max")
