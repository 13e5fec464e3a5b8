"""HeteroBatch's settings, held once in a read-only :class:`HeteroBatchSettings` (the expert knobs in
:class:`HeteroBatchAdvanced`): a bad setting fails at construction, naming it; what the callback cannot run with fails
at setup, before the first batch (:func:`check_trainer`).

Two rules derived from the settings live here too. Batch-statistics layers: a BatchNorm layer in training mode
normalises by the batch's own mean and variance and rejects a batch of one sample ("Expected more than 1 value per
channel"), so a model with such layers gets at least :data:`BATCH_STATISTICS_FLOOR` samples per rank and step, the
epoch's last partial global batch included (:func:`model_floor`). The learning rate: while the global batch stays
constant it needs no change, whatever the per-rank split; when a user trains with a global batch different from the
one the learning rate was tuned for, ``batch_lr_scaling`` applies one of the common rules, linear (Goyal et al.) or
square-root (Krizhevsky; Hoffer et al.) (:func:`lr_scale_factor`).

Example::

    >>> from torch import nn
    >>> batch_floor(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))), batch_floor(nn.Linear(4, 4))
    (2, 1)
    >>> raised_min_batch_size(1, floor=2), raised_min_batch_size([1, 4], floor=2), raised_min_batch_size(3, floor=2)
    (2, [2, 4], 3)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from lightning_hetero._deprecation import moved_keywords, warn_renamed
from lightning_hetero._validation import check_range
from lightning_hetero.contracts import HeteroBatchStrategy
from lightning_hetero.param_groups import scale_learning_rates


@dataclass(frozen=True)
class HeteroBatchAdvanced:
    """Expert knobs of :class:`~lightning_hetero.hetero_batch.HeteroBatchCallback`, given as its ``advanced=``: every
    guide's example runs with their defaults.

    Args:
        deadband: apply a new split only when it is predicted to shorten the synchronous step by more than this
            fraction (a cluster-wide decision); a smaller gain beyond 2% and the measurement noise, proposed at two
            adjustments in a row, is applied too (a refinement, see
            :class:`~lightning_hetero.hetero_batch.policy.AdjustmentPolicy`).
        warmup_steps: measurements discarded at the start of fit (and one after each change of split).
        rollback_tolerance: a change of split is undone when the synchronous step measured after it is slower than
            the one measured before it by more than this fraction.
        change_tolerance: a rank whose measured busy time misses its model's prediction by more than this fraction
            forgets its older measurements (its speed changed, or the model was wrong) and starts again from the
            newest period.
        smoothing: EWMA weight of the newest compute-window throughput in ``callback.meter``, which
            :class:`~lightning_hetero.switching.SyncSwitchCallback` reads for its straggler detector; the split does
            not use it.
        seed: seeds the per-epoch permutation, identically on every rank.

    Raises:
        ValueError: a knob is out of range, naming it.

    Example::

        >>> HeteroBatchAdvanced(warmup_steps=1).warmup_steps
        1
        >>> HeteroBatchAdvanced(deadband=-0.1)
        Traceback (most recent call last):
        ...
        ValueError: deadband must be >= 0, got -0.1
    """

    deadband: float = 0.05
    warmup_steps: int = 3
    rollback_tolerance: float = 0.15
    change_tolerance: float = 0.4
    smoothing: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        check_range("deadband", self.deadband, low=0)
        check_range("warmup_steps", self.warmup_steps, low=0, integer=True)
        check_range("rollback_tolerance", self.rollback_tolerance, low=0)
        check_range("change_tolerance", self.change_tolerance, low=0, low_open=True)
        check_range("smoothing", self.smoothing, low=0, high=1, low_open=True)


@dataclass(frozen=True)
class HeteroBatchSettings:
    """What a :class:`~lightning_hetero.hetero_batch.HeteroBatchCallback` was constructed with, checked and held once
    (read-only; sequences become tuples). The arguments are the callback's (see its ``Args:``).

    Raises:
        ValueError: naming the first bad setting.

    Example::

        >>> settings = HeteroBatchSettings(min_batch_size=[2, 4], advanced=HeteroBatchAdvanced(warmup_steps=1))
        >>> settings.min_batch_size, settings.advanced.warmup_steps
        ((2, 4), 1)
        >>> HeteroBatchSettings(min_batch_size=8, max_batch_size=4)
        Traceback (most recent call last):
        ...
        ValueError: min_batch_size (8) must not exceed max_batch_size (4)
    """

    global_batch_size: int | None = None
    initial_batch_sizes: tuple[int, ...] | None = None
    min_batch_size: int | tuple[int, ...] = 1
    max_batch_size: int | tuple[int, ...] | None = None
    memory_caps: tuple[int | None, ...] | str | None = None
    batch_size_multiple: int | str = "auto"
    adjust_every_n_steps: int | None = None
    batch_lr_scaling: str | None = None
    verbose: bool = True
    advanced: HeteroBatchAdvanced = field(default_factory=HeteroBatchAdvanced)

    def __post_init__(self) -> None:
        for name in ("initial_batch_sizes", "min_batch_size", "max_batch_size", "memory_caps"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, int | str):
                object.__setattr__(self, name, tuple(value))  # frozen: set once, here
        min_size, max_size = self.min_batch_size, self.max_batch_size
        for name, value in (("min_batch_size", min_size), ("max_batch_size", max_size)):
            for v in [value] if isinstance(value, int) else list(value or []):
                check_range(name, v, low=1, integer=True)
        if isinstance(min_size, int) and isinstance(max_size, int) and min_size > max_size:
            raise ValueError(f"min_batch_size ({min_size}) must not exceed max_batch_size ({max_size})")
        check_range("global_batch_size", self.global_batch_size, low=1, integer=True, optional=True)
        for size in self.initial_batch_sizes or []:
            check_range("initial_batch_sizes", size, low=1, integer=True)
        check_range("adjust_every_n_steps", self.adjust_every_n_steps, low=1, integer=True, optional=True)
        if self.batch_lr_scaling is not None and self.batch_lr_scaling not in LR_SCALING_RULES:
            raise ValueError(
                f"batch_lr_scaling must be one of {LR_SCALING_RULES} or None, got {self.batch_lr_scaling!r}"
            )
        caps = self.memory_caps
        if isinstance(caps, str) and caps != "auto":
            raise ValueError(f"memory_caps must be 'auto', one size (or None) per rank, or None; got {caps!r}")
        for cap in [] if caps is None or isinstance(caps, str) else caps:
            check_range("memory_caps", cap, low=1, integer=True, optional=True)
        if self.batch_size_multiple != "auto":
            check_range("batch_size_multiple", self.batch_size_multiple, low=1, integer=True)
        if not isinstance(self.advanced, HeteroBatchAdvanced):
            raise TypeError(f"advanced must be a HeteroBatchAdvanced, got {type(self.advanced).__name__}")

    def global_batch(self, loader_global_batch: int) -> int:
        """``global_batch_size``, else the sum of ``initial_batch_sizes``, else the loader's ``batch_size`` x world size.

        Example::

            >>> HeteroBatchSettings(initial_batch_sizes=[3, 13]).global_batch(loader_global_batch=64)
            16
        """
        initial = self.initial_batch_sizes
        return self.global_batch_size or (sum(initial) if initial else loader_global_batch)

    def check_world_size(self, world_size: int) -> None:
        """Fail, naming the setting, when ``initial_batch_sizes`` does not give one size per rank.

        Example::

            >>> HeteroBatchSettings(initial_batch_sizes=[3, 13]).check_world_size(4)
            Traceback (most recent call last):
            ...
            ValueError: initial_batch_sizes has 2 entries but the world size is 4
        """
        initial = self.initial_batch_sizes
        if initial is not None and len(initial) != world_size:
            raise ValueError(f"initial_batch_sizes has {len(initial)} entries but the world size is {world_size}")


def resolve_batch_size_multiple(setting: int | str, device: str, global_batch: int, world_size: int) -> tuple[int, str]:
    """The multiple per-rank sizes are drawn from, and why: ``"auto"`` is 8 on CUDA when every rank's equal share
    holds at least four multiples of 8 (tensor cores, and few shapes for ``torch.compile``), else 1 (on CPUs sizes
    stay free: small batches would otherwise move in coarse steps).

    Example::

        >>> resolve_batch_size_multiple("auto", "cuda", global_batch=256, world_size=2)[0]
        8
        >>> resolve_batch_size_multiple("auto", "cpu", global_batch=256, world_size=2)
        (1, 'on cpu sizes stay free (8 is the default on CUDA)')
    """
    if setting != "auto":
        return int(setting), "as set"
    if device != "cuda":
        return 1, f"on {device} sizes stay free (8 is the default on CUDA)"
    if global_batch < 32 * world_size:
        return 1, f"an equal share ({global_batch // world_size}) holds fewer than four multiples of 8"
    return 8, "on CUDA: tensor-core friendly sizes and few shapes for torch.compile"


def check_trainer(trainer: pl.Trainer, module: pl.LightningModule, memory_caps: Any = None) -> None:
    """Fail at setup, naming the setting, the reason and the alternative, for a strategy that is neither DDP nor FSDP
    nor offers :class:`~lightning_hetero.contracts.HeteroBatchStrategy`, and for ``memory_caps="auto"`` with manual
    optimization. Manual optimization itself is accepted: ``manual_backward`` calls the same ``on_before_backward``
    hook the automatic backward does, where the rank's loss is weighted by its share.

    Args:
        trainer: the Trainer.
        module: the LightningModule.
        memory_caps: the callback's ``memory_caps``.
    """
    if not module.automatic_optimization and memory_caps == "auto":
        raise ValueError(
            "HeteroBatchCallback(memory_caps='auto') needs automatic optimization (`self.automatic_optimization = "
            "False` found): a step that runs out of memory is redone in chunks under Lightning's automatic backward, "
            "and a hand-written training_step steps its optimizers itself; give memory_caps as one size per rank, or "
            "use automatic optimization."
        )
    strategy = trainer.strategy
    if trainer.world_size > 1 and not isinstance(strategy, (DDPStrategy, FSDPStrategy, HeteroBatchStrategy)):
        raise ValueError(
            f"HeteroBatchCallback supports strategy='ddp', 'fsdp' (and strategies offering HeteroBatchStrategy), "
            f"not {type(strategy).__name__}"
        )


log = logging.getLogger(__name__)

#: samples a rank needs per step when the model normalises by batch statistics
BATCH_STATISTICS_FLOOR = 2


def batch_floor(module: nn.Module) -> int:
    """The smallest per-rank batch ``module`` trains on: 2 with BatchNorm layers (any ``_BatchNorm``), else 1."""
    return BATCH_STATISTICS_FLOOR if any(isinstance(m, _BatchNorm) for m in module.modules()) else 1


def raised_min_batch_size(min_batch_size: int | Sequence[int], floor: int) -> int | list[int]:
    """``min_batch_size`` (an int, or one per rank) raised to at least ``floor``.

    Args:
        min_batch_size: the user's setting.
        floor: :func:`batch_floor` of the model.
    """
    if isinstance(min_batch_size, int):
        return max(min_batch_size, floor)
    return [max(size, floor) for size in min_batch_size]


def model_floor(module: nn.Module, min_batch_size: int | Sequence[int]) -> int:
    """:func:`batch_floor` of ``module``, said once (on rank 0, and logged) when it raises ``min_batch_size``.

    Args:
        module: the model.
        min_batch_size: the user's setting.
    """
    floor = batch_floor(module)
    given = min_batch_size if isinstance(min_batch_size, int) else list(min_batch_size)
    if raised_min_batch_size(min_batch_size, floor) != given:
        message = (
            f"HeteroBatchCallback: min_batch_size={given!r} raised to {floor} per rank (the epoch's last batch "
            "included): the model has BatchNorm layers, which reject a one-sample batch in training."
        )
        log.info(message)
        rank_zero_info(message)
    return floor


#: the rules ``batch_lr_scaling`` accepts
LR_SCALING_RULES = ("linear", "sqrt")


def scale_learning_rates_once(trainer: Any, rule: str | None, loader_global_batch: int, global_batch: int) -> None:
    """Scale the Trainer's learning rates (and its schedulers' base rates) by :func:`lr_scale_factor`: once per run,
    when the train loader has fixed both global batches (the callback's checkpoint remembers it was done)."""
    factor = lr_scale_factor(rule, loader_global_batch, global_batch)
    scale_learning_rates(trainer.optimizers, [config.scheduler for config in trainer.lr_scheduler_configs], factor)


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


def old_keywords(
    batch_lr_scaling: str | None, advanced: HeteroBatchAdvanced | None, old: dict[str, Any]
) -> tuple[str | None, HeteroBatchAdvanced]:
    """``batch_lr_scaling`` and ``advanced`` (default: :class:`HeteroBatchAdvanced`'s defaults) with the deprecated
    keywords in ``old`` taken in: ``lr_scaling`` (``batch_lr_scaling``'s old name) and the expert knobs' own
    (``HeteroBatchCallback(deadband=...)``). Each one warns (removed in the next release) and takes effect.

    Raises:
        TypeError: a keyword that never was one, or an old keyword given with its new place.

    Example::

        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     old_keywords(None, None, {"warmup_steps": 1, "lr_scaling": "sqrt"})[0]
        'sqrt'
        >>> [str(warning.message).split("; ")[1] for warning in caught]
        ['use HeteroBatchCallback(batch_lr_scaling=...)', 'use HeteroBatchCallback(advanced=HeteroBatchAdvanced(warmup_steps=...))']
    """
    knobs = dict(old)
    if knobs.get("lr_scaling") is not None:
        if batch_lr_scaling is not None:
            raise TypeError("HeteroBatchCallback: give batch_lr_scaling only (lr_scaling is its deprecated old name)")
        # stacklevel 4: the line constructing the callback
        warn_renamed("HeteroBatchCallback(lr_scaling=...)", "HeteroBatchCallback(batch_lr_scaling=...)", stacklevel=4)
    batch_lr_scaling = knobs.pop("lr_scaling", None) or batch_lr_scaling
    knob_names = {knob.name for knob in fields(HeteroBatchAdvanced)}
    return batch_lr_scaling, moved_keywords("HeteroBatchCallback", HeteroBatchAdvanced, knob_names, advanced, knobs)


#: the callback's former attributes, where they now live (served from there with a warning for one release)
MOVED_ATTRIBUTES = {
    **dict.fromkeys(("controller", "policy", "plan", "cost", "period", "costs", "busy_s", "sync_step_s"), "tuner"),
    **dict.fromkeys(("throughputs",), "tuner"),
    **{setting.name: "settings" for setting in fields(HeteroBatchSettings) if setting.name != "advanced"},
    **{knob.name: "settings.advanced" for knob in fields(HeteroBatchAdvanced)},
}


def moved_attribute(callback: Any, name: str) -> Any:
    """The callback's former attribute ``name`` (its settings, and the tuner's parts), read where it now lives with
    a ``DeprecationWarning`` (``None`` while there is no tuner); for the callback's ``__getattr__``.

    Raises:
        AttributeError: ``name`` never was one.

    Example::

        >>> import warnings
        >>> from lightning_hetero.hetero_batch import HeteroBatchCallback
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     HeteroBatchCallback(advanced=HeteroBatchAdvanced(seed=7)).seed
        7
        >>> str(caught[0].message).split(";")[1]
        ' use HeteroBatchCallback.settings.advanced.seed'
    """
    owner = MOVED_ATTRIBUTES.get(name)
    if owner is None:
        raise AttributeError(f"{type(callback).__name__!r} object has no attribute {name!r}")
    warn_renamed(f"HeteroBatchCallback.{name}", f"HeteroBatchCallback.{owner}.{name}", stacklevel=4)
    return None if vars(callback).get(owner.split(".")[0]) is None else attrgetter(f"{owner}.{name}")(callback)
