"""The big batch's gradient from per-rank batches of different sizes: the weight on each rank's loss gradient, the
weight of each micro-batch under gradient accumulation, and a batch over its memory cap run in chunks.

**Weighting** (:func:`~lightning_hetero.batch_weighting.weight_backward`). With unequal local batches DDP's plain mean ``(1/N) Σ g_k`` over-weights the
samples of small batches. The big-batch gradient is ``Σ b_k g_k / Σ b_k`` (each ``g_k`` being the mean over rank
``k``'s batch). If rank ``k`` back-propagates ``N b_k / Σ b`` instead of 1 from its loss
(:func:`~lightning_hetero.batch_weighting.averaged_weight`), its gradient is ``N b_k g_k / Σ b`` and DDP's built-in
C++ all-reduce, which averages over the ``N`` ranks, yields exactly the big-batch gradient. No Python communication
hook runs per bucket (it would cost CPU time every step), a user's ``ddp_comm_hook`` that averages composes with it,
and anything downstream of the all-reduce (gradient clipping, AMP's unscaling) sees the same gradients as with one
big batch. With equal shares the weight is exactly 1 and the gradient is left untouched. The same hook on the loss
queues an autograd final callback, which the engine runs when this rank's backward has computed every gradient and
before DDP's own final callback waits for the all-reduce: the end of the rank's compute (see
:class:`~lightning_hetero.hetero_batch.timing.ComputeEndMarks`).

**Accumulation** (:func:`step_weight`). Lightning divides every micro-batch's loss by ``accumulate_grad_batches``
(``k``) and steps after ``k`` micro-batches (or at the epoch's last one); DDP then averages over the ``N`` ranks.
Rank ``r``'s micro-batch ``i`` (``b_ri`` of the window's ``T = sum_i sum_r b_ri`` samples) therefore back-propagates
``k N b_ri / T`` from its local-mean loss: the step's gradient is ``sum_i sum_r b_ri g_ri / T``. Without
accumulation (``k = 1``) this is :func:`~lightning_hetero.batch_weighting.averaged_weight`; with equal global
batches in the window it is too, and the epoch's last, shorter window is where the two differ.

**Chunks** (:func:`run_in_chunks`, ``memory_caps="auto"``). The chunks are ``batch_size_multiple`` samples or
multiples of it wherever the cap and the batch allow (:func:`chunk_size`): the shapes stay within the few that
``torch.compile`` and tensor cores are given elsewhere. A batch that is not a multiple itself (an epoch's last)
leaves its remainder in the last chunk; a cap below the multiple is used as it is, since no multiple fits.

Example::

    >>> marks = []
    >>> w = torch.ones(2, requires_grad=True)
    >>> loss = (w * torch.tensor([1.0, 3.0])).mean()
    >>> weight_backward(loss, 1.5, on_compute_end=lambda: marks.append("end"))
    >>> loss.backward()
    >>> w.grad.tolist(), marks
    ([0.75, 2.25], ['end'])
    >>> window(batch_idx=4, accumulate=3, steps_per_epoch=8)  # the second window: steps 3, 4, 5
    range(3, 6)
    >>> window(batch_idx=7, accumulate=3, steps_per_epoch=8)  # the epoch's last window is short
    range(6, 8)
    >>> micro_batch_weight((6, 2), rank=1, window_total=24, accumulate=3)  # = averaged_weight for full windows
    0.5
    >>> micro_batch_weight((3, 1), rank=0, window_total=12, accumulate=3)  # the short last window weighs more
    1.5
    >>> [len(piece) for piece in split_batch(torch.arange(48), size=48, chunk=chunk_size(cap=20, multiple=8))]
    [16, 16, 16]
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from lightning_hetero.batch_weighting import batch_share, weight_backward
from lightning_hetero.contracts import HeteroBatchStrategy


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


def chunk_size(cap: int, multiple: int) -> int:
    """The largest chunk within ``cap`` that is a multiple of ``multiple`` (``cap`` itself when below it).

    Example::

        >>> chunk_size(20, 8), chunk_size(16, 8), chunk_size(5, 8), chunk_size(18, 1)
        (16, 16, 5, 18)
    """
    return cap // multiple * multiple if cap >= multiple else max(1, cap)


def split_batch(batch: Any, size: int, chunk: int) -> list[Any]:
    """``batch`` cut along its first dimension into pieces of at most ``chunk`` samples (tensors whose first
    dimension is ``size``, inside tuples, lists and dicts; anything else is repeated in each piece).

    Example::

        >>> x, y = torch.arange(10).reshape(5, 2), torch.arange(5)
        >>> [tuple(t.shape) for t in split_batch((x, y), size=5, chunk=2)[2]]
        [(1, 2), (1,)]
    """
    starts = range(0, size, chunk)

    def cut(item: Any, start: int) -> Any:
        if isinstance(item, torch.Tensor) and item.dim() > 0 and item.shape[0] == size:
            return item[start : start + chunk]
        if isinstance(item, Mapping):
            return type(item)({k: cut(v, start) for k, v in item.items()})  # type: ignore[call-arg]
        if isinstance(item, tuple | list):
            return type(item)(cut(v, start) for v in item)
        return item

    return [cut(batch, start) for start in starts]


def run_in_chunks(
    first: Any, rest: Any, strategy: Any, module: Any, batch: Any, size: int, chunk: int, args: Any, kw: Any
) -> Any:
    """``batch`` (``size`` samples) through the training step in chunks of ``chunk``: every chunk but the last
    back-propagated at once (without DDP's all-reduce), its gradients kept aside; the last returned with a term
    whose gradient is what was kept, so the one backward Lightning runs (and DDP's all-reduce) carries the whole
    batch's mean gradient. ``first`` runs the first chunk (the strategy's own step), ``rest`` the others.

    Example::

        >>> w = torch.nn.Linear(1, 1, bias=False)
        >>> step = lambda x: w(x).mean()  # a loss is its batch's mean
        >>> out = run_in_chunks(step, step, None, w, torch.ones(4, 1), size=4, chunk=2, args=(), kw={})
        >>> out.backward(); w.weight.grad  # the mean over the 4 samples, as one batch gives
        tensor([[1.]])
    """
    chunks = split_batch(batch, size, chunk)
    params = [p for p in module.parameters() if p.requires_grad]
    kept: list[torch.Tensor | None] = [None] * len(params)
    early_loss = 0.0
    no_sync = getattr(getattr(strategy, "model", None), "no_sync", contextlib.nullcontext)
    for index, piece in enumerate(chunks[:-1]):
        with no_sync():
            step = first if index == 0 else rest
            loss = _loss_of(step(piece, *args, **kw)) * (_size_of(piece, size) / size)
            grads = torch.autograd.grad(loss, params, allow_unused=True)
        early_loss += float(loss.detach())
        kept = [g if k is None else (k if g is None else k + g) for k, g in zip(kept, grads, strict=True)]
        del loss, grads
    out = rest(chunks[-1], *args, **kw)
    last = _loss_of(out) * (_size_of(chunks[-1], size) / size)
    carried = sum((p * k).sum() for p, k in zip(params, kept, strict=True) if k is not None)
    total = last + early_loss + (carried - carried.detach() if isinstance(carried, torch.Tensor) else 0.0)
    return {**out, "loss": total} if isinstance(out, Mapping) else total


def _loss_of(output: Any) -> torch.Tensor:
    return output["loss"] if isinstance(output, Mapping) else output


def _size_of(chunk: Any, size: int) -> int:
    tensors = [t for t in _tensors(chunk) if t.dim() > 0]
    return int(tensors[0].shape[0]) if tensors else size


def _tensors(item: Any) -> list[torch.Tensor]:
    if isinstance(item, torch.Tensor):
        return [item]
    if isinstance(item, Mapping):
        return [t for v in item.values() for t in _tensors(v)]
    if isinstance(item, tuple | list):
        return [t for v in item for t in _tensors(v)]
    return []


class LossWeighting:
    """What this rank back-propagates from its loss at each step (:func:`~lightning_hetero.batch_weighting.weight_backward` with :func:`step_weight`),
    or, where a :class:`~lightning_hetero.contracts.HeteroBatchStrategy` weights the gradient itself (without
    accumulation), the batch share it weights by.

    Example::

        >>> weighting = LossWeighting()
        >>> weighting.attach(strategy=None, marks=None, accumulate=1, world_size=2)  # DDP: the loss is weighted
        >>> from lightning_hetero.hetero_batch.batches import HeteroBatchSampler, SplitPlan
        >>> sampler = HeteroBatchSampler(list(range(256)), SplitPlan([48, 16]), rank=1)
        >>> weighting.step((48, 16), rank=1, batch_idx=0, accumulate=1, sampler=sampler)
        >>> weighting.share, weighting.weight
        (0.25, 0.5)
    """

    def __init__(self) -> None:
        #: this rank's share of the step's global batch
        self.share = 1.0
        #: what the rank back-propagates from its loss (``None``: the strategy weights the gradient)
        self.weight: float | None = None
        self._marks: Any = None

    def attach(self, strategy: Any, marks: Any, accumulate: int, world_size: int) -> None:
        """At fit start: who weights, and what marks the end of the rank's compute (``marks.mark_compute_end``).
        Accumulating, each micro-batch weighs its loss and the strategy averages, as DDP does."""
        own = isinstance(strategy, HeteroBatchStrategy) and accumulate == 1
        self.weight, self._marks = None if own else 1.0, marks
        if isinstance(strategy, HeteroBatchStrategy):
            strategy.attach_hetero_batches(marks, lambda: self.share if own else 1 / world_size)

    def step(self, split: Sequence[int], rank: int, batch_idx: int, accumulate: int, sampler: Any) -> None:
        """A step at ``split`` starts: ``batch_idx`` of the epoch of ``sampler`` (a
        :class:`~lightning_hetero.hetero_batch.batches.HeteroBatchSampler`, which knows every step's global batch),
        with ``accumulate_grad_batches`` of ``accumulate``."""
        self.share = batch_share(split, rank)
        if self.weight is not None:
            epoch = sampler.epoch
            self.weight = step_weight(
                split, rank, batch_idx, accumulate, len(sampler), lambda step: sum(sampler.sizes_at(epoch, step))
            )

    def backward(self, loss: torch.Tensor) -> None:
        """Weight the coming backward from ``loss`` (where the loss is weighted)."""
        if self.weight is not None and self._marks is not None:
            weight_backward(loss, self.weight, self._marks.mark_compute_end)
