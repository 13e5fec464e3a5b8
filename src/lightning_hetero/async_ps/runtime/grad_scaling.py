"""fp16's ``GradScaler`` across ranks (``precision="16-mixed"``): the ranks' scalers made one, at the smallest scale.

A scaler's decisions follow the gradients it unscales. In BSP every rank unscales the same all-reduced gradient (the
sum of the ranks' scaled gradients, as under DDP), so an inf/NaN on any rank reaches every rank through the sum, every
rank skips that step and every scaler backs off alike; this needs the scalers to agree when BSP is entered, since in
ASP each rank's scaler saw only its own gradients. In local SGD a rank's local steps are its own: a step skipped for
inf/NaN is skipped on that rank, which keeps its parameters finite, and its pseudo-gradient, taken from the fp32
parameters, carries no scale. The ranks' scalers are made one at each round end, where the parameters are: each rank's
scale and growth count ride in the round-end SUM all-reduce at its own slots (:func:`fold_scaler`, no collective of
their own), and every rank takes the smallest (:func:`unfold_scaler`). Lightning saves rank 0's scaler in
checkpoints, and every rank loads it on resume.

Agreeing takes each scaler's smallest scale and growth count over the ranks, so no rank keeps a scale another rank
found to overflow:

    >>> scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    >>> state = agreed_state(scaler.state_dict(), torch.tensor([256.0, 3.0]))
    >>> state["scale"], state["_growth_tracker"]
    (256.0, 3)
    >>> grad_scaler(object()) is None  # 32-bit and bf16 precision: no scaler, nothing to agree
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


def grad_scaler(precision_plugin: Any) -> torch.amp.GradScaler | None:
    """The precision plugin's enabled ``GradScaler`` (fp16 mixed precision), else ``None``."""
    scaler = getattr(precision_plugin, "scaler", None)
    return scaler if scaler is not None and scaler.is_enabled() else None


def scaler_vector(state: dict[str, Any], device: torch.device | str = "cpu") -> torch.Tensor:
    """``[scale, growth count]`` of a scaler's ``state_dict`` as one float32 tensor for a MIN all-reduce (scales are
    float32 in the scaler, growth counts stay exact below 2**24)."""
    return torch.tensor([float(state["scale"]), float(state["_growth_tracker"])], dtype=torch.float32, device=device)


def agreed_state(state: dict[str, Any], minima: torch.Tensor) -> dict[str, Any]:
    """``state`` (a scaler's ``state_dict``) with the scale and growth count all-reduced to ``minima``."""
    low = minima.cpu().tolist()
    return {**state, "scale": float(low[0]), "_growth_tracker": int(low[1])}


def agree_scalers(
    precision_plugin: Any, collective: Callable[[Callable[[], Any]], Any], group: Any = None, device: Any = "cpu"
) -> None:
    """Make every rank's scaler the same (the smallest scale and growth count over ``group``); nothing to do without
    a scaler (every rank has one or none: the precision is the Trainer's).

    Args:
        precision_plugin: the strategy's precision plugin.
        collective: runs the all-reduce (``FaultTolerance.collective``: a broken one names the rank lost).
        group: the ranks that agree (``None``: the default group).
        device: where the all-reduced tensor lives (the parameters' device: NCCL needs CUDA tensors).
    """
    scaler = grad_scaler(precision_plugin)
    if scaler is None:
        return
    minima = scaler_vector(scaler.state_dict(), device)
    collective(lambda: dist.all_reduce(minima, op=dist.ReduceOp.MIN, group=group))
    scaler.load_state_dict(agreed_state(scaler.state_dict(), minima))


def fold_scaler(precision_plugin: Any, message: torch.Tensor, rank: int, world_size: int) -> tuple[torch.Tensor, int]:
    """``message`` (a SUM all-reduce's) with this rank's scaler appended: ``world_size`` scale slots then
    ``world_size`` growth-count slots, this rank's filled, the others 0 (the sum then holds every rank's; a rank lost
    from the group leaves its scale slot 0). Returns the message and how many values were appended (0: no scaler).

    Example::

        >>> from lightning.pytorch.plugins.precision import MixedPrecision
        >>> plugin = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=8.0))
        >>> fold_scaler(plugin, torch.ones(2), rank=1, world_size=2)
        (tensor([1., 1., 0., 8., 0., 0.]), 4)
        >>> fold_scaler(object(), torch.ones(2), rank=1, world_size=2)[1]  # no scaler: the message as it is
        0
    """
    scaler = grad_scaler(precision_plugin)
    if scaler is None:
        return message, 0
    slots = torch.zeros(2, world_size, dtype=message.dtype, device=message.device)
    slots[:, rank] = scaler_vector(scaler.state_dict(), message.device).to(message.dtype)
    return torch.cat([message, slots.reshape(-1)]), slots.numel()


def unfold_scaler(precision_plugin: Any, summed: torch.Tensor, folded: int) -> torch.Tensor:
    """The all-reduced message without :func:`fold_scaler`'s values, the scaler set to the smallest scale and growth
    count of the ranks that sent one.

    Example::

        >>> from lightning.pytorch.plugins.precision import MixedPrecision
        >>> scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
        >>> plugin = MixedPrecision("16-mixed", "cpu", scaler=scaler)
        >>> unfold_scaler(plugin, torch.tensor([2.0, 2.0, 4.0, 8.0, 0.0, 5.0, 9.0, 0.0]), folded=6)
        tensor([2., 2.])
        >>> scaler.get_scale(), scaler.state_dict()["_growth_tracker"]  # rank 2 is not in the group
        (4.0, 5)
    """
    if folded == 0:
        return summed
    slots = summed[-folded:].reshape(2, -1).cpu()
    present = slots[0] > 0
    scaler = grad_scaler(precision_plugin)
    assert scaler is not None  # the precision is the Trainer's: every rank has a scaler or none
    scaler.load_state_dict(agreed_state(scaler.state_dict(), slots[:, present].amin(dim=1)))
    return summed[:-folded]
