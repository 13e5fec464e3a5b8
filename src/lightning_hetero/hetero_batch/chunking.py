"""A batch over a rank's memory cap run in chunks with the whole batch's gradient (``memory_caps="auto"``).

The chunks are ``batch_size_multiple`` samples or multiples of it wherever the cap and the batch allow
(:func:`chunk_size`): the shapes stay within the few that ``torch.compile`` and tensor cores are given elsewhere. A
batch that is not a multiple itself (an epoch's last) leaves its remainder in the last chunk; a cap below the
multiple is used as it is, since no multiple fits.

Example::

    >>> [len(piece) for piece in split_batch(torch.arange(48), size=48, chunk=chunk_size(cap=20, multiple=8))]
    [16, 16, 16]
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch


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
