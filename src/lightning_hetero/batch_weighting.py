"""The batch-weighting rule: how much one rank's gradient counts when local batches differ in size.

Each rank's gradient ``g_k`` is the mean over its local batch of ``b_k`` samples. The gradient of the big batch (all
ranks' samples together) is ``sum_k b_k g_k / sum(b)``: rank ``k``'s gradient counts with its batch share
``b_k / sum(b)``. ``AsyncPSStrategy``'s synchronous all-reduce (BSP) and its parameter server (ASP), where one rank's
gradient is applied alone, call :func:`gradient_weight`; under DDP, which averages, each rank back-propagates
:func:`averaged_weight` from its loss (:mod:`lightning_hetero.hetero_batch.gradients`).

Example::

    >>> share = batch_share((3, 13), rank=0)
    >>> share
    0.1875
    >>> gradient_weight(share)  # summed with the other ranks' weighted gradients
    0.1875
    >>> gradient_weight(share, alone_among=2)  # applied on its own, as an asynchronous update
    0.375
    >>> averaged_weight((3, 13), rank=0)  # averaged with the other ranks' weighted gradients (DDP)
    0.375
"""

from __future__ import annotations

from collections.abc import Sequence


def batch_share(split: Sequence[int], rank: int) -> float:
    """Rank ``rank``'s share ``b_k / sum(b)`` of the step's global batch ``split`` (one size per rank)."""
    return split[rank] / sum(split)


def equal_share(world_size: int) -> float:
    """The share of each of ``world_size`` ranks with equal batches (what ranks use without ``HeteroBatchCallback``).

    Example::

        >>> equal_share(4)
        0.25
    """
    return 1.0 / world_size


def gradient_weight(share: float, alone_among: int | None = None) -> float:
    """The factor a rank's local-mean gradient is multiplied by, given its batch ``share`` (``b_k / sum(b)``).

    Args:
        share: the rank's share of the step's global batch.
        alone_among: ``None`` when the ranks' weighted gradients are summed into one update (an all-reduce: the sum
            is the big-batch gradient); the number of ranks when the gradient makes an update on its own (an
            asynchronous push to the parameter server): then it weighs ``b_k / mean(b) = share * alone_among``
            (1 for equal shares), as much as the rank's data would in the synchronous mean.
    """
    return share if alone_among is None else share * alone_among


def averaged_weight(split: Sequence[int], rank: int) -> float:
    """The factor rank ``rank``'s local-mean gradient is multiplied by when the ranks' gradients are *averaged* (DDP's
    built-in all-reduce): ``N b_k / sum(b)``, so that the mean over ``N`` ranks is ``sum_k b_k g_k / sum(b)``.
    Computed from integers, so that equal shares give exactly 1.

    Example::

        >>> averaged_weight((21, 21, 21), rank=1)
        1.0
    """
    return len(split) * split[rank] / sum(split)
