"""The checks behind ``HeteroBatchCallback(...)``: a bad setting fails at construction, naming it; what the callback
cannot run with fails at setup, before the first batch (:func:`check_trainer`); and the tuner its settings build
once the global batch and the device are known.

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
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from lightning_hetero._validation import check_range
from lightning_hetero.contracts import HeteroBatchStrategy
from lightning_hetero.hetero_batch.controller import BatchSizeController
from lightning_hetero.hetero_batch.tuner import SplitTuner
from lightning_hetero.param_groups import scale_learning_rates as scale_learning_rates  # re-exported for the callback


def check_settings(
    *,
    global_batch_size: int | None,
    initial_batch_sizes: Sequence[int] | None,
    min_batch_size: int | Sequence[int],
    max_batch_size: int | Sequence[int] | None,
    deadband: float,
    smoothing: float,
    adjust_every_n_steps: int | None,
    batch_lr_scaling: str | None,
    rollback_tolerance: float,
    change_tolerance: float,
    memory_caps: Sequence[int | None] | str | None = None,
    batch_size_multiple: int | str = "auto",
) -> None:
    """Raise ``ValueError`` naming the first bad setting.

    Example::

        >>> good = dict(global_batch_size=64, initial_batch_sizes=None, min_batch_size=1, max_batch_size=None,
        ...             deadband=0.05, smoothing=0.5, adjust_every_n_steps=None, batch_lr_scaling=None,
        ...             rollback_tolerance=0.15, change_tolerance=0.4)
        >>> check_settings(**good)
        >>> check_settings(**good | {"min_batch_size": 8, "max_batch_size": 4})
        Traceback (most recent call last):
        ...
        ValueError: min_batch_size (8) must not exceed max_batch_size (4)
    """
    for name, value in (("min_batch_size", min_batch_size), ("max_batch_size", max_batch_size)):
        for v in [value] if isinstance(value, int) else list(value or []):
            check_range(name, v, low=1, integer=True)
    if isinstance(min_batch_size, int) and isinstance(max_batch_size, int) and min_batch_size > max_batch_size:
        raise ValueError(f"min_batch_size ({min_batch_size}) must not exceed max_batch_size ({max_batch_size})")
    check_range("global_batch_size", global_batch_size, low=1, integer=True, optional=True)
    for size in initial_batch_sizes or []:
        check_range("initial_batch_sizes", size, low=1, integer=True)
    check_range("adjust_every_n_steps", adjust_every_n_steps, low=1, integer=True, optional=True)
    check_range("deadband", deadband, low=0)
    check_range("smoothing", smoothing, low=0, high=1, low_open=True)
    if batch_lr_scaling is not None and batch_lr_scaling not in LR_SCALING_RULES:
        raise ValueError(f"batch_lr_scaling must be one of {LR_SCALING_RULES} or None, got {batch_lr_scaling!r}")
    check_range("rollback_tolerance", rollback_tolerance, low=0)
    check_range("change_tolerance", change_tolerance, low=0, low_open=True)
    if isinstance(memory_caps, str) and memory_caps != "auto":
        raise ValueError(f"memory_caps must be 'auto', one size (or None) per rank, or None; got {memory_caps!r}")
    for cap in [] if memory_caps is None or isinstance(memory_caps, str) else memory_caps:
        check_range("memory_caps", cap, low=1, integer=True, optional=True)
    if batch_size_multiple != "auto":
        check_range("batch_size_multiple", batch_size_multiple, low=1, integer=True)


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


def new_tuner(settings: Any, global_batch: int, rank: int, world_size: int, device: str, floor: int = 1) -> SplitTuner:
    """The tuner for ``settings`` (a ``HeteroBatchCallback``'s attributes), printing the batch-size multiple chosen;
    ``floor`` is the samples a rank needs per step (2 with BatchNorm, :mod:`~lightning_hetero.hetero_batch.settings`).

    Example::

        >>> from lightning_hetero import HeteroBatchCallback
        >>> new_tuner(HeteroBatchCallback(), global_batch=64, rank=0, world_size=2, device="cpu").split
        (32, 32)
    """
    initial = settings.initial_batch_sizes
    if initial is not None and sum(initial) != global_batch:
        raise ValueError(f"initial_batch_sizes sum to {sum(initial)}, not the global batch {global_batch}")
    multiple, why = resolve_batch_size_multiple(settings.batch_size_multiple, device, global_batch, world_size)
    rank_zero_info(f"HeteroBatchCallback: per-rank batch sizes in multiples of {multiple} ({why})")
    controller = BatchSizeController(
        global_batch,
        world_size,
        min_batch_size=raised_min_batch_size(settings.min_batch_size, floor),
        max_batch_size=settings.max_batch_size,
        memory_caps=None if settings.memory_caps == "auto" else settings.memory_caps,
        deadband=settings.deadband,
        batch_size_multiple=multiple,
    )
    return SplitTuner(
        controller,
        rank,
        start=initial,
        rollback_tolerance=settings.rollback_tolerance,
        change_tolerance=settings.change_tolerance,
        warmup_steps=settings.warmup_steps,
    )


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
    if raised_min_batch_size(min_batch_size, floor) != min_batch_size:
        message = (
            f"HeteroBatchCallback: min_batch_size={min_batch_size!r} raised to {floor} per rank (the epoch's last batch "
            "included): the model has BatchNorm layers, which reject a one-sample batch in training."
        )
        log.info(message)
        rank_zero_info(message)
    return floor


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
