"""fp16's ``GradScaler`` across ranks (``precision="16-mixed"``): the ranks' scalers made one, at the smallest scale.

A scaler's decisions follow the gradients it unscales. In BSP every rank unscales the same all-reduced gradient (the
sum of the ranks' scaled gradients, as under DDP), so an inf/NaN on any rank reaches every rank through the sum, every
rank skips that step and every scaler backs off alike; this needs the scalers to agree when BSP is entered, since in
ASP and local SGD each rank's scaler saw only its own gradients. In local SGD a rank's local steps are its own: a step
skipped for inf/NaN is skipped on that rank, which keeps its parameters finite, and its pseudo-gradient, taken from the
fp32 parameters, carries no scale. The ranks' scalers are made one where their inner optimizers' states are (when
the local phase ends). Lightning saves rank 0's scaler in checkpoints, and every rank loads it on resume.

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
