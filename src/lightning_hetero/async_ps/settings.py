"""``AsyncPSStrategy``'s settings, checked at construction (whatever the starting mode, since a switch may enter
any mode later), each failure naming the setting: the common ones in :class:`PSSettings`, the expert knobs in
:class:`PSAdvanced`; and the old keywords, taken in with a ``DeprecationWarning`` (:func:`old_keywords`).

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
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from lightning_hetero._deprecation import moved_keywords, warn_renamed
from lightning_hetero._validation import check_range
from lightning_hetero.asp.compensation import check_compensation_mode
from lightning_hetero.asp.placement import check_server_placement
from lightning_hetero.asp.sharding import check_server_shards
from lightning_hetero.asp.staleness import staleness_lr_factor
from lightning_hetero.contracts import Mode, check_mode
from lightning_hetero.local_sgd.outer_optimizer import OuterOptimizer
from lightning_hetero.local_sgd.round_plan import RoundBudget, check_local_steps, parse_round_length
from lightning_hetero.local_sgd.rounds import check_weighting

#: the accepted values of ``AsyncPSStrategy(on_worker_lost=...)``
ON_WORKER_LOST = ("fail", "continue")

#: local steps per rank in a round unless ``round_length`` says otherwise
DEFAULT_ROUND_LENGTH = 16


@dataclass(frozen=True)
class PSAdvanced:
    """Expert knobs of :class:`~lightning_hetero.async_ps.strategy.AsyncPSStrategy`, given as its ``advanced=``: every
    guide's example runs with their defaults.

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
        find_unused_parameters: BSP: as ``DDPStrategy(find_unused_parameters=True)``, for a model with parameters
            that some steps' losses do not use (DDP's reducer otherwise fails at the next step, naming this knob).

    Raises:
        ValueError: a knob is out of range or does not combine with another, naming it.

    Example::

        >>> PSAdvanced(overlap_round_trip=True).overlap_round_trip
        True
        >>> PSAdvanced(startup_timeout_s=0)
        Traceback (most recent call last):
        ...
        ValueError: startup_timeout_s must be > 0, got 0
    """

    lr_scaling: str = "none"
    startup_timeout_s: float = 300.0
    local_steps: str = "proportional"
    pseudo_gradient_weighting: str = "mean"
    overlap_round_trip: bool = False
    server_shards: int = 1
    server_placement: str = "worker"
    find_unused_parameters: bool = False

    def __post_init__(self) -> None:
        staleness_lr_factor(0, self.lr_scaling)
        check_range("startup_timeout_s", self.startup_timeout_s, low=0, low_open=True)
        check_local_steps(self.local_steps)
        check_weighting(self.pseudo_gradient_weighting)
        if not isinstance(self.overlap_round_trip, bool):
            raise ValueError(f"overlap_round_trip must be True or False, got {self.overlap_round_trip!r}")
        if not isinstance(self.find_unused_parameters, bool):
            raise ValueError(f"find_unused_parameters must be True or False, got {self.find_unused_parameters!r}")
        check_server_shards(self.server_shards)
        check_server_placement(self.server_placement, self.server_shards)


@dataclass(frozen=True)
class PSSettings:
    """The constructor arguments of :class:`~lightning_hetero.async_ps.strategy.AsyncPSStrategy`, checked when built
    (its docstring tells them; the expert ones are :class:`PSAdvanced`). ``outer`` is the outer optimizer's factory
    and ``round_budget`` the local SGD round, both built from the arguments. Read-only once built: the strategy holds
    it once.

    Raises:
        ValueError: naming the first bad setting.
        TypeError: ``advanced`` is not a :class:`PSAdvanced`.

    Example::

        >>> PSSettings(round_length="30s", advanced=PSAdvanced(local_steps="equal")).round_budget.seconds
        30.0
    """

    mode: Mode = "asp"
    max_staleness: int | None = None
    asynchrony_compensation: str | None = "auto"
    fault_timeout_s: float = 60.0
    on_worker_lost: str = "fail"
    round_length: int | str = DEFAULT_ROUND_LENGTH
    outer_optimizer: Callable[..., torch.optim.Optimizer] | None = None
    outer_optimizer_kwargs: dict[str, Any] | None = None
    advanced: PSAdvanced = field(default_factory=PSAdvanced)
    outer: OuterOptimizer = field(init=False)
    round_budget: RoundBudget = field(init=False)

    def __post_init__(self) -> None:
        check_mode(self.mode)
        check_range("max_staleness", self.max_staleness, low=0, integer=True, optional=True)
        check_compensation_mode(self.asynchrony_compensation)
        check_range("fault_timeout_s", self.fault_timeout_s, low=0, low_open=True)
        if self.on_worker_lost not in ON_WORKER_LOST:
            raise ValueError(f"on_worker_lost must be one of {ON_WORKER_LOST}, got {self.on_worker_lost!r}")
        if self.mode == "local" and self.on_worker_lost == "continue":
            raise ValueError(
                "AsyncPSStrategy(mode='local') cannot honour on_worker_lost='continue': every round ends in an "
                "all-reduce over all ranks, so losing one ends the job. Use on_worker_lost='fail' and resume from the "
                "last checkpoint, or start in mode='asp' (on_worker_lost='continue' applies to ASP phases only)."
            )
        # derived once, in the frozen dataclass's constructor
        object.__setattr__(self, "round_budget", parse_round_length(self.round_length))
        object.__setattr__(self, "outer", OuterOptimizer(self.outer_optimizer, self.outer_optimizer_kwargs))
        if not isinstance(self.advanced, PSAdvanced):
            raise TypeError(f"advanced must be a PSAdvanced, got {type(self.advanced).__name__}")
        check_server_shards(self.advanced.server_shards, on_worker_lost=self.on_worker_lost)
        check_server_placement(self.advanced.server_placement, self.advanced.server_shards, self.on_worker_lost)


def old_keywords(
    round_length: int | str, advanced: PSAdvanced | None, old: dict[str, Any]
) -> tuple[int | str, PSAdvanced]:
    """``round_length`` and ``advanced`` (default: :class:`PSAdvanced`'s defaults) with ``AsyncPSStrategy``'s
    deprecated keywords in ``old`` taken in: ``round_samples=N`` (``round_length="N samples"``), ``round_s=T``
    (``round_length="Ts"``) and the expert knobs' own (``AsyncPSStrategy(server_shards=...)``). Each one warns
    (removed in the next release) and takes effect.

    Raises:
        TypeError: a keyword that never was one, or an old keyword given with its new place.

    Example::

        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     old_keywords(16, None, {"round_s": 2.5, "server_shards": 2})
        ('2.5s', PSAdvanced(lr_scaling='none', startup_timeout_s=300.0, local_steps='proportional', pseudo_gradient_weighting='mean', overlap_round_trip=False, server_shards=2, server_placement='worker', find_unused_parameters=False))
        >>> [str(warning.message).split("; ")[1] for warning in caught]
        ["use AsyncPSStrategy(round_length='2.5s')", 'use AsyncPSStrategy(advanced=PSAdvanced(server_shards=...))']
    """
    knobs = dict(old)
    lengths = {"round_samples": " samples", "round_s": "s"}  # the unit each old keyword counted in
    for name, unit in lengths.items():
        value = knobs.pop(name, None)
        if value is None:
            continue
        if round_length != DEFAULT_ROUND_LENGTH:
            raise TypeError(f"AsyncPSStrategy: give round_length only ({name} is a deprecated old keyword)")
        round_length = f"{value}{unit}"
        warn_renamed(f"AsyncPSStrategy({name}=...)", f"AsyncPSStrategy(round_length={round_length!r})", stacklevel=4)
    knob_names = {knob.name for knob in fields(PSAdvanced)}
    return round_length, moved_keywords("AsyncPSStrategy", PSAdvanced, knob_names, advanced, knobs)


class _ReadOnlySetting:
    """A strategy's attribute that reads the setting of the same name from its ``settings`` (so the settings are
    held once) and refuses to be set; one that moved into ``settings.advanced`` is read there with a warning."""

    def __init__(self, moved: bool) -> None:
        self.moved = moved

    def __set_name__(self, owner: type, name: str) -> None:
        self.owner, self.name = owner.__name__, name

    def __get__(self, strategy: Any, owner: type | None = None) -> Any:
        if strategy is None:
            return self
        if not self.moved:
            return getattr(strategy.settings, self.name)
        warn_renamed(f"{self.owner}.{self.name}", f"{self.owner}.settings.advanced.{self.name}")
        return getattr(strategy.settings.advanced, self.name)

    def __set__(self, strategy: Any, value: Any) -> None:
        raise AttributeError(f"{self.owner}.{self.name} is read-only (a setting given to the constructor)")


def read_only_settings(count: int, moved: bool = False) -> tuple[_ReadOnlySetting, ...]:
    """``count`` read-only views of settings, one per class attribute they are assigned to (named after it);
    ``moved``: expert knobs, now read from ``settings.advanced`` with a ``DeprecationWarning``.

    Example::

        >>> class Owner:
        ...     settings = PSSettings(max_staleness=4)
        ...     max_staleness, fault_timeout_s = read_only_settings(2)
        >>> Owner().max_staleness, Owner().fault_timeout_s
        (4, 60.0)
        >>> Owner().max_staleness = 2
        Traceback (most recent call last):
        ...
        AttributeError: Owner.max_staleness is read-only (a setting given to the constructor)
    """
    return tuple(_ReadOnlySetting(moved) for _ in range(count))
