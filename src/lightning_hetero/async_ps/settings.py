"""``AsyncPSStrategy``'s settings, checked at construction (whatever the starting mode, since a switch may enter
any mode later), each failure naming the setting.

Example::

    >>> PSSettings(max_staleness=4).max_staleness
    4
    >>> PSSettings(fault_timeout_s=0)
    Traceback (most recent call last):
    ...
    ValueError: fault_timeout_s must be > 0, got 0
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from lightning_hetero._validation import check_range
from lightning_hetero.asp.compensation import check_compensation_mode
from lightning_hetero.asp.placement import check_server_placement
from lightning_hetero.asp.sharding import check_server_shards
from lightning_hetero.asp.staleness import staleness_lr_factor
from lightning_hetero.contracts import Mode, check_mode
from lightning_hetero.local_sgd.outer_optimizer import OuterOptimizer
from lightning_hetero.local_sgd.round_plan import RoundBudget, check_local_steps
from lightning_hetero.local_sgd.rounds import check_weighting

#: the accepted values of ``AsyncPSStrategy(on_worker_lost=...)``
ON_WORKER_LOST = ("fail", "continue")


@dataclass(frozen=True)
class PSSettings:
    """The constructor arguments of :class:`~lightning_hetero.async_ps.strategy.AsyncPSStrategy`, checked when built; its
    docstring tells the common ones, and the expert ones are these:

    Args:
        lr_scaling: ``"none"``, or ``"inverse"`` to divide the learning rate of each update by its staleness.
        startup_timeout_s: how long the ranks wait for each other at start-up (the process group's rendezvous).
        local_steps: local SGD: ``"proportional"`` (each rank's steps follow its throughput) or ``"equal"``.
        pseudo_gradient_weighting: local SGD: ``"mean"`` over the ranks that trained, or by their ``"samples"``.
        overlap_round_trip: ``False`` (default): textbook ASP, each worker waits for its reply; ``True``: the push
            and the reply travel while the next batch is computed, faster where the round trip is long next to a step,
            at one own update of extra staleness.
        server_shards: split the server into this many shards of whole tensors, hosted by ranks
            ``0 .. server_shards - 1`` (``docs/async_ps.md``, Sharding); not with ``on_worker_lost="continue"``.
        server_placement: ``"worker"``: rank 0 hosts the server and trains like the others; ``"dedicated"``: in ASP
            it trains only its first batch of each epoch (:mod:`~lightning_hetero.asp.placement`).
        mode: as the strategy's argument.
        max_staleness: as the strategy's argument.
        asynchrony_compensation: as the strategy's argument.
        fault_timeout_s: as the strategy's argument.
        on_worker_lost: as the strategy's argument.
        round_samples: as the strategy's argument.
        round_s: as the strategy's argument.
        outer_optimizer: as the strategy's argument.
        outer_optimizer_kwargs: as the strategy's argument.

    ``outer`` is the outer optimizer's factory and
    ``round_budget`` the local SGD round (``None``: the default), both built from the arguments. Read-only once built: the strategy holds it once."""

    mode: Mode = "asp"
    max_staleness: int | None = None
    lr_scaling: str = "none"
    asynchrony_compensation: str | None = "auto"
    fault_timeout_s: float = 60.0
    startup_timeout_s: float = 300.0
    on_worker_lost: str = "fail"
    round_samples: int | None = None
    round_s: float | None = None
    local_steps: str = "proportional"
    outer_optimizer: Callable[..., torch.optim.Optimizer] | None = None
    outer_optimizer_kwargs: dict[str, Any] | None = None
    pseudo_gradient_weighting: str = "mean"
    overlap_round_trip: bool = False
    server_shards: int = 1
    server_placement: str = "worker"
    outer: OuterOptimizer = field(init=False)
    round_budget: RoundBudget | None = field(init=False)

    def __post_init__(self) -> None:
        check_mode(self.mode)
        check_range("max_staleness", self.max_staleness, low=0, integer=True, optional=True)
        staleness_lr_factor(0, self.lr_scaling)
        check_compensation_mode(self.asynchrony_compensation)
        check_range("fault_timeout_s", self.fault_timeout_s, low=0, low_open=True)
        check_range("startup_timeout_s", self.startup_timeout_s, low=0, low_open=True)
        if self.on_worker_lost not in ON_WORKER_LOST:
            raise ValueError(f"on_worker_lost must be one of {ON_WORKER_LOST}, got {self.on_worker_lost!r}")
        if self.mode == "local" and self.on_worker_lost == "continue":
            raise ValueError(
                "AsyncPSStrategy(mode='local') cannot honour on_worker_lost='continue': every round ends in an "
                "all-reduce over all ranks, so losing one ends the job. Use on_worker_lost='fail' and resume from the "
                "last checkpoint, or start in mode='asp' (on_worker_lost='continue' applies to ASP phases only)."
            )
        check_local_steps(self.local_steps)
        check_weighting(self.pseudo_gradient_weighting)
        no_budget = self.round_samples is None and self.round_s is None
        budget = None if no_budget else RoundBudget(samples=self.round_samples, seconds=self.round_s)
        object.__setattr__(self, "round_budget", budget)  # derived once, in the frozen dataclass's constructor
        object.__setattr__(self, "outer", OuterOptimizer(self.outer_optimizer, self.outer_optimizer_kwargs))
        if not isinstance(self.overlap_round_trip, bool):
            raise ValueError(f"overlap_round_trip must be True or False, got {self.overlap_round_trip!r}")
        check_server_shards(self.server_shards, on_worker_lost=self.on_worker_lost)
        check_server_placement(self.server_placement, self.server_shards, self.on_worker_lost)


class _ReadOnlySetting:
    """A strategy's attribute that reads the setting of the same name from its ``settings`` (so the settings are
    held once) and refuses to be set."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.owner, self.name = owner.__name__, name

    def __get__(self, strategy: Any, owner: type | None = None) -> Any:
        return self if strategy is None else getattr(strategy.settings, self.name)

    def __set__(self, strategy: Any, value: Any) -> None:
        raise AttributeError(f"{self.owner}.{self.name} is read-only (a setting given to the constructor)")


def read_only_settings(count: int) -> tuple[_ReadOnlySetting, ...]:
    """``count`` read-only views of settings, one per class attribute they are assigned to (named after it).

    Example::

        >>> class Owner:
        ...     settings = PSSettings(max_staleness=4)
        ...     max_staleness, server_shards = read_only_settings(2)
        >>> Owner().max_staleness, Owner().server_shards
        (4, 1)
        >>> Owner().max_staleness = 2
        Traceback (most recent call last):
        ...
        AttributeError: Owner.max_staleness is read-only (a setting given to the constructor)
    """
    return tuple(_ReadOnlySetting() for _ in range(count))
