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

#: the settings ``AsyncPSStrategy`` keeps as attributes of the same name
PUBLIC_SETTINGS = (
    "max_staleness", "lr_scaling", "fault_timeout_s", "startup_timeout_s", "on_worker_lost", "local_steps",
    "pseudo_gradient_weighting", "overlap_round_trip", "server_shards", "server_placement",
)  # fmt: skip
#: the accepted values of ``AsyncPSStrategy(on_worker_lost=...)``
ON_WORKER_LOST = ("fail", "continue")


@dataclass
class PSSettings:
    """The constructor arguments of :class:`~lightning_hetero.async_ps.strategy.AsyncPSStrategy` (see its docstring for
    each), checked when built. ``outer`` is the outer optimizer's factory and ``round_budget`` the local SGD round
    (``None``: the default), both built from the arguments."""

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
        self.round_budget = None if no_budget else RoundBudget(samples=self.round_samples, seconds=self.round_s)
        self.outer = OuterOptimizer(self.outer_optimizer, self.outer_optimizer_kwargs)
        if not isinstance(self.overlap_round_trip, bool):
            raise ValueError(f"overlap_round_trip must be True or False, got {self.overlap_round_trip!r}")
        check_server_shards(self.server_shards, on_worker_lost=self.on_worker_lost)
        check_server_placement(self.server_placement, self.server_shards, self.on_worker_lost)
