"""What the user's optimizer becomes while a strategy makes the update itself (:class:`OptimizerStandIn`): Lightning's
loop and precision plugin call its ``step`` as they would the optimizer's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.optim import Optimizer


class OptimizerStandIn:
    """Stands in for the user's optimizer where a strategy makes the update itself: ``step`` runs ``step_with`` on the
    closure (forward, backward, hooks, clipping), which then updates as the mode does (ASP: pushes the gradients to
    the parameter server); every other attribute is the optimizer's. Without a closure (fp16: the precision plugin
    ran it and its ``GradScaler`` unscaled the gradients) ``step_with`` gets ``None``; a step the scaler skips
    (inf/NaN) never reaches ``step``.

    Args:
        optimizer: the user's optimizer (every other attribute is read from it).
        step_with: runs the closure and the update; its result is ``step``'s.

    Example::

        >>> import torch
        >>> optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        >>> stand_in = OptimizerStandIn(optimizer, lambda closure: ("updated after", closure()))
        >>> stand_in.step(lambda: "loss"), stand_in.param_groups is optimizer.param_groups
        (('updated after', 'loss'), True)
    """

    def __init__(self, optimizer: Optimizer, step_with: Callable[[Callable[[], Any] | None], Any]) -> None:
        self._optimizer = optimizer
        self._step_with = step_with

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        return self._step_with(closure)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)
