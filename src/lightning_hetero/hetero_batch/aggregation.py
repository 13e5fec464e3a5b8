"""The batch-weighted gradient mean through DDP's own averaging: each rank scales the gradient of its loss.

With unequal local batches DDP's plain mean ``(1/N) Σ g_k`` over-weights the samples of small batches. The big-batch
gradient is ``Σ b_k g_k / Σ b_k`` (each ``g_k`` being the mean over rank ``k``'s batch). If rank ``k`` back-propagates
``N b_k / Σ b`` instead of 1 from its loss (:func:`~lightning_hetero.batch_weighting.averaged_weight`), its gradient
is ``N b_k g_k / Σ b`` and DDP's built-in C++ all-reduce, which averages over the ``N`` ranks, yields exactly the
big-batch gradient. No Python communication hook runs per bucket (it would cost CPU time every step), a user's
``ddp_comm_hook`` that averages composes with it, and anything downstream of the all-reduce (gradient clipping,
AMP's unscaling) sees the same gradients as with one big batch. With equal shares the weight is exactly 1 and the
gradient is left untouched.

The same hook on the loss queues an autograd final callback, which the engine runs when this rank's backward has
computed every gradient and before DDP's own final callback waits for the all-reduce: the end of the rank's compute
(see :class:`~lightning_hetero.hetero_batch.window.ComputeEndMarks`).

Example::

    >>> import torch
    >>> marks = []
    >>> w = torch.ones(2, requires_grad=True)
    >>> loss = (w * torch.tensor([1.0, 3.0])).mean()
    >>> weight_backward(loss, 1.5, on_compute_end=lambda: marks.append("end"))
    >>> loss.backward()
    >>> w.grad.tolist(), marks
    ([0.75, 2.25], ['end'])
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd import Variable


def weight_backward(loss: torch.Tensor, weight: float, on_compute_end: Callable[[], None]) -> None:
    """Make the coming ``backward`` from ``loss`` start from ``weight`` instead of 1, and call ``on_compute_end``
    once the backward pass has computed every gradient (before the engine's later final callbacks, such as DDP's
    wait for its all-reduce). A ``loss`` that does not require gradients is left alone, and so is one already
    weighted: its hook stays on it and weights a second backward through a retained graph too (manual
    optimization's ``manual_backward(loss, retain_graph=True)`` twice)."""
    if not loss.requires_grad or getattr(loss, "_hetero_weighted", False):
        return
    loss._hetero_weighted = True  # type: ignore[attr-defined]

    def hook(grad: torch.Tensor) -> torch.Tensor | None:
        Variable._execution_engine.queue_callback(on_compute_end)  # type: ignore[attr-defined]
        return None if weight == 1.0 else grad * weight

    loss.register_hook(hook)
