"""Gradient accumulation with per-rank batch sizes: the weight each micro-batch's loss is back-propagated with, so
that an optimizer step's gradient is the batch-weighted mean over all the micro-batches it accumulated, i.e. the
gradient of the big batch made of all their samples on all ranks.

Lightning divides every micro-batch's loss by ``accumulate_grad_batches`` (``k``) and steps after ``k`` micro-batches
(or at the epoch's last one); DDP then averages over the ``N`` ranks. Rank ``r``'s micro-batch ``i`` (``b_ri`` of the
window's ``T = sum_i sum_r b_ri`` samples) therefore back-propagates ``k N b_ri / T`` from its local-mean loss: the
step's gradient is ``sum_i sum_r b_ri g_ri / T``. Without accumulation (``k = 1``) this is
:func:`~lightning_hetero.batch_weighting.averaged_weight`; with equal global batches in the window it is too, and the
epoch's last, shorter window is where the two differ.

Example::

    >>> window(batch_idx=4, accumulate=3, steps_per_epoch=8)  # the second window: steps 3, 4, 5
    range(3, 6)
    >>> window(batch_idx=7, accumulate=3, steps_per_epoch=8)  # the epoch's last window is short
    range(6, 8)
    >>> micro_batch_weight((6, 2), rank=1, window_total=24, accumulate=3)  # = averaged_weight for full windows
    0.5
    >>> micro_batch_weight((3, 1), rank=0, window_total=12, accumulate=3)  # the short last window weighs more
    1.5
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def window(batch_idx: int, accumulate: int, steps_per_epoch: int) -> range:
    """The steps of the epoch whose gradients the optimizer step after ``batch_idx`` accumulates.

    Args:
        batch_idx: the step within the epoch.
        accumulate: ``accumulate_grad_batches``.
        steps_per_epoch: the epoch's steps (its last one always steps the optimizer).
    """
    start = batch_idx // accumulate * accumulate
    return range(start, min(start + accumulate, steps_per_epoch))


def micro_batch_weight(split: Sequence[int], rank: int, window_total: int, accumulate: int) -> float:
    """What rank ``rank`` back-propagates from its local-mean loss at a step of ``split`` (``k N b_r / T``).

    Args:
        split: every rank's batch size at this step.
        rank: this rank.
        window_total: samples on all ranks over the window's steps (``T``).
        accumulate: ``accumulate_grad_batches`` (``k``).
    """
    return accumulate * len(split) * split[rank] / window_total


def step_weight(
    split: Sequence[int], rank: int, batch_idx: int, accumulate: int, steps_per_epoch: int,
    global_sizes: Callable[[int], int],
) -> float:  # fmt: skip
    """:func:`micro_batch_weight` at step ``batch_idx``, the window's total read from ``global_sizes(step)``.

    Args:
        split: every rank's batch size at this step.
        rank: this rank.
        batch_idx: the step within the epoch.
        accumulate: ``accumulate_grad_batches``.
        steps_per_epoch: the epoch's steps.
        global_sizes: the global batch at a step of this epoch.
    """
    total = sum(global_sizes(step) for step in window(batch_idx, accumulate, steps_per_epoch))
    return micro_batch_weight(split, rank, total, accumulate)
