"""The batch-weighting rule: how much one rank's gradient counts when local batches differ in size.

Each rank's gradient ``g_k`` is the mean over its local batch of ``b_k`` samples. The gradient of the big batch (all
ranks' samples together) is ``sum_k b_k g_k / sum(b)``: rank ``k``'s gradient counts with its batch share
``b_k / sum(b)``. ``AsyncPSStrategy``'s parameter server (ASP, where one rank's gradient is applied alone) and the
elastic synchronous steps (which sum) call :func:`gradient_weight`; under DDP's reducer, which averages (DDP, and
BSP), each rank back-propagates :func:`averaged_weight` from its loss (:func:`weight_backward`).

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

from collections.abc import Callable, Sequence

import torch
from torch.autograd import Variable


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


def weight_backward(
    loss: torch.Tensor, weight: float, on_compute_end: Callable[[], None], by: str = "hetero_batch"
) -> None:
    """Make the coming ``backward`` from ``loss`` start from ``weight`` instead of 1, and call ``on_compute_end``
    once the backward pass has computed every gradient (before the engine's later final callbacks, such as DDP's
    wait for its all-reduce). A ``loss`` that does not require gradients is left alone, and so is one already
    weighted ``by`` the same weigher: its hook stays on it and weights a second backward through a retained graph too
    (manual optimization's ``manual_backward(loss, retain_graph=True)`` twice). Two weighers (the callback under
    accumulation, and BSP's reducer, of which one weighs 1) multiply."""
    mark = f"_weighted_by_{by}"
    if not loss.requires_grad or getattr(loss, mark, False):
        return
    setattr(loss, mark, True)

    def hook(grad: torch.Tensor) -> torch.Tensor | None:
        Variable._execution_engine.queue_callback(on_compute_end)  # type: ignore[attr-defined]
        return None if weight == 1.0 else grad * weight

    loss.register_hook(hook)
