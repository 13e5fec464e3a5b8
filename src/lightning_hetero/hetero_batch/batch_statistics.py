"""Batch-statistics layers and the smallest batch they accept: a BatchNorm layer in training mode normalises by the
batch's own mean and variance and rejects a batch of one sample ("Expected more than 1 value per channel"), so a
model with such layers gets at least :data:`BATCH_STATISTICS_FLOOR` samples per rank and step, the epoch's last
partial global batch included.

Example::

    >>> from torch import nn
    >>> batch_floor(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))), batch_floor(nn.Linear(4, 4))
    (2, 1)
    >>> raised_min_batch_size(1, floor=2), raised_min_batch_size([1, 4], floor=2), raised_min_batch_size(3, floor=2)
    (2, [2, 4], 3)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

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
