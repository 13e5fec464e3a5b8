"""The batch-weighted gradient mean, as a DDP communication hook.

With unequal local batches DDP's plain mean ``(1/N) Σ g_k`` over-weights the samples of small batches. The big-batch
gradient is ``Σ b_k g_k / Σ b_k`` (each ``g_k`` being the mean over rank ``k``'s batch), so each rank scales its
bucket by its share ``b_k / Σ b`` and the ranks SUM-all-reduce (the rule: :mod:`lightning_hetero.batch_weighting`).

The hook is registered on the wrapped ``DistributedDataParallel`` model directly, because Lightning registers
``ddp_comm_hook`` only on CUDA and silently ignores it on CPU. Its first action also closes the rank's compute
window (see :class:`~lightning_hetero.measurement.ComputeTimer`): when DDP hands over the last bucket the rank's
backward is done, and whatever follows is waiting for the others.

No ``from __future__ import annotations`` here: DDP inspects the hook's annotations at registration time.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from lightning_hetero.batch_weighting import gradient_weight
from lightning_hetero.measurement import ComputeTimer


@dataclass
class BatchWeightState:
    """What the hook needs: this rank's share of the current step's global batch, and the compute timer (a
    :class:`ComputeTimer`, or anything with its ``mark_compute_end()``)."""

    share: Callable[[], float]
    timer: ComputeTimer | Any
    process_group: dist.ProcessGroup | None = None


def batch_weighted_allreduce_hook(
    state: BatchWeightState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Scale the bucket by ``b_k / Σ b`` (:func:`~lightning_hetero.batch_weighting.gradient_weight`) and
    SUM-all-reduce it, after marking the end of this rank's compute."""
    state.timer.mark_compute_end()
    buffer = bucket.buffer()
    buffer.mul_(gradient_weight(state.share()))
    work = dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=state.process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def register_batch_weighted_hook(ddp_model: torch.nn.parallel.DistributedDataParallel, state: BatchWeightState) -> None:
    """Register the hook, with an actionable error when another hook is already installed."""
    try:
        ddp_model.register_comm_hook(state, batch_weighted_allreduce_hook)
    except RuntimeError as error:
        raise RuntimeError(
            "HeteroBatchCallback installs its own DDP communication hook (the batch-weighted gradient mean) and "
            "could not register it; remove `ddp_comm_hook`/`ddp_comm_wrapper` from DDPStrategy. "
            f"PyTorch said: {error}"
        ) from error
