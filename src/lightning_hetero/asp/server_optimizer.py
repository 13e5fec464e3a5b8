"""The server's copy of the user's optimizer, over the server's flat parameters: the same class and hyper-parameters,
with the fastest step implementation torch offers for it (fused, else foreach).
"""

from __future__ import annotations

import inspect
from collections.abc import Collection, Sequence
from typing import Any

import torch
from torch.optim import Optimizer

from lightning_hetero.param_groups import hyperparameters

#: param-group keys that choose how an optimizer computes its step, not what it computes: the server picks its own
#: (:func:`fast_clone_optimizer`) and never copies them from the template
IMPLEMENTATION_KEYS = frozenset({"foreach", "fused", "capturable", "differentiable"})


def clone_optimizer(
    template: Optimizer,
    params: Sequence[torch.Tensor],
    index_of: dict[int, int],
    overrides: dict[str, Any] | None = None,
    foreign: Collection[int] = frozenset(),
) -> Optimizer:
    """A fresh optimizer of ``template``'s class and hyper-parameters over ``params`` (the server's copies).

    Args:
        template: the optimizer ``configure_optimizers`` returned.
        params: the server's parameter tensors, in layout order.
        index_of: ``id(model_parameter) -> layout index`` for the template's parameters.
        overrides: hyper-parameters to set in every group instead of the template's (e.g. ``{"fused": True}``).
        foreign: ``id`` of the template's parameters that other server shards hold (left out; a group may end up
            empty, and keeps its place so that groups match the template's one to one).

    Example::

        >>> import torch
        >>> model = torch.nn.Linear(2, 1)
        >>> template = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
        >>> copies = [p.detach().clone() for p in model.parameters()]
        >>> clone = clone_optimizer(template, copies, {id(p): i for i, p in enumerate(model.parameters())})
        >>> type(clone).__name__, clone.param_groups[0]["lr"], clone.param_groups[0]["params"][0] is copies[0]
        ('SGD', 0.5, True)
    """
    groups = []
    for group in template.param_groups:
        # a frozen parameter never gets a gradient, so the optimizer never moves it: the server leaves it out
        mine = [p for p in group["params"] if id(p) not in foreign and (p.requires_grad or id(p) in index_of)]
        missing = [p for p in mine if id(p) not in index_of]
        if missing:
            raise ValueError(
                "AsyncPSStrategy: the optimizer holds parameters that are not trainable parameters of the model "
                f"(shapes {[tuple(p.shape) for p in missing]}); the parameter server cannot lay them out."
            )
        groups.append(
            {
                **hyperparameters(group),
                **(overrides or {}),
                "params": [params[index_of[id(p)]] for p in mine],
            }
        )
    # ``defaults`` may hold entries the constructor does not take (AdamW's ``decoupled_weight_decay``); each group
    # carries every hyper-parameter anyway, so pass only what the signature accepts
    parameters = inspect.signature(type(template)).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    kwargs = {key: value for key, value in template.defaults.items() if takes_any or key in parameters}
    kwargs.update({key: value for key, value in (overrides or {}).items() if takes_any or key in parameters})
    try:
        return type(template)(groups, **kwargs)
    except TypeError as err:
        raise ValueError(
            f"AsyncPSStrategy: cannot rebuild the optimizer {type(template).__name__} on the parameter server "
            f"from its param_groups and defaults: {err}"
        ) from err


def fast_clone_optimizer(
    template: Optimizer,
    params: Sequence[torch.Tensor],
    index_of: dict[int, int],
    foreign: Collection[int] = frozenset(),
) -> tuple[Optimizer, str]:
    """:func:`clone_optimizer` with the fastest implementation torch offers for the class on the server's CPU
    parameters: ``fused`` (one kernel per parameter, a single pass over its memory), else ``foreach``, else the
    template's. The update is the same up to floating-point rounding. Returns the optimizer and the implementation.

    Args:
        template: the optimizer ``configure_optimizers`` returned.
        params: the server's parameter tensors (CPU, float32), in layout order.
        index_of: ``id(model_parameter) -> layout index`` for the template's parameters.
        foreign: see :func:`clone_optimizer`.

    Example::

        >>> import torch
        >>> model = torch.nn.Linear(2, 1)
        >>> template = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
        >>> copies = [p.detach().clone() for p in model.parameters()]
        >>> clone, implementation = fast_clone_optimizer(template, copies, {id(p): i for i, p in enumerate(model.parameters())})
        >>> implementation, clone.param_groups[0]["fused"], template.param_groups[0]["fused"]
        ('fused', True, None)
    """
    accepted = inspect.signature(type(template)).parameters
    if not any(group.get("differentiable") for group in template.param_groups):
        for implementation, overrides in (("fused", {"fused": True, "foreach": None}), ("foreach", {"foreach": True})):
            if not set(overrides) <= set(accepted):
                continue
            try:
                return clone_optimizer(template, params, index_of, overrides, foreign), implementation
            except (ValueError, RuntimeError):
                continue  # the class does not offer it for these parameters (dtype, device or other settings)
    return clone_optimizer(template, params, index_of, foreign=foreign), "default"
