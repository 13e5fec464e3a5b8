"""The outer optimizer of local SGD: it moves the start-of-round parameters along the ranks' combined pseudo-gradient.

A round's pseudo-gradient is ``start-of-round parameters - end-of-round parameters`` (what the inner optimizer did,
with the sign of a gradient). The default, ``SGD(lr=1.0)``, is plain parameter averaging (post-local SGD): it kept
BSP's accuracy in every measured run, where DiLoCo's (Douillard et al., arXiv 2311.08105) Nesterov SGD, learning rate
0.7 and momentum 0.9, lost 5-8 points in 4-epoch runs of 16-step rounds (its momentum amplifies a round's progress
up to 7x, which suits hundreds of inner steps per round): ``outer_optimizer_kwargs={"lr": 0.7, "momentum": 0.9,
"nesterov": True}`` gives DiLoCo's.
Any ``torch.optim.Optimizer`` class works: the outer optimizer sees one flat tensor, so element-wise optimizers (SGD,
Adam, ...) behave as on the model's own parameters.

Pure torch, no torch.distributed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

#: the outer optimizer (DiLoCo's class).
DEFAULT_OUTER_OPTIMIZER: Callable[..., Optimizer] = torch.optim.SGD
#: plain averaging (DiLoCo's: ``{"lr": 0.7, "momentum": 0.9, "nesterov": True}``).
DEFAULT_OUTER_KWARGS: dict[str, Any] = {"lr": 1.0}


def _name(optimizer_class: Any) -> str:
    return getattr(optimizer_class, "__qualname__", None) or repr(optimizer_class)


class OuterOptimizer:
    """Applies combined pseudo-gradients to the start-of-round parameters (the *anchor*) with a torch optimizer.

    The optimizer is built once on a dummy tensor at construction, so a class or keyword arguments that cannot make
    an optimizer fail there, naming the setting, instead of at the first round's end.

    Args:
        optimizer_class: a ``torch.optim.Optimizer`` subclass, or any callable ``(params, **kwargs) -> Optimizer``
            (default ``torch.optim.SGD``).
        kwargs: its keyword arguments (default ``lr=1.0``: plain averaging; an explicit ``optimizer_class`` without
            ``kwargs`` gets that class's own defaults).

    Example::

        >>> OuterOptimizer().description  # plain averaging of the ranks' parameters
        'SGD(lr=1.0)'
        >>> outer = OuterOptimizer(torch.optim.SGD, {"lr": 0.7, "momentum": 0.9, "nesterov": True})  # DiLoCo's
        >>> anchor = torch.tensor([1.0, 2.0])
        >>> outer.bind(anchor)
        >>> outer.step(torch.tensor([0.1, -0.1]))  # first step: lr * (1 + momentum) * pseudo-gradient
        >>> anchor
        tensor([0.8670, 2.1330])
        >>> OuterOptimizer(torch.optim.SGD, {"lr": -1.0})
        Traceback (most recent call last):
        ...
        ValueError: outer_optimizer=SGD cannot be built with outer_optimizer_kwargs={'lr': -1.0}: Invalid learning rate: -1.0
    """

    def __init__(
        self,
        optimizer_class: Callable[..., Optimizer] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        if optimizer_class is None:
            optimizer_class = DEFAULT_OUTER_OPTIMIZER
            kwargs = dict(DEFAULT_OUTER_KWARGS) if kwargs is None else kwargs
        kwargs = {} if kwargs is None else dict(kwargs)
        if not callable(optimizer_class):
            raise ValueError(f"outer_optimizer must be a torch.optim.Optimizer class, got {optimizer_class!r}")
        self.optimizer_class = optimizer_class
        self.kwargs = kwargs
        self._build(torch.zeros(1))  # validates
        self._optimizer: Optimizer | None = None
        self._anchor: Tensor | None = None
        self._pending_state: dict[str, Any] | None = None

    def _build(self, anchor: Tensor) -> Optimizer:
        where = (
            f"outer_optimizer={_name(self.optimizer_class)} cannot be built with outer_optimizer_kwargs={self.kwargs}"
        )
        try:
            optimizer = self.optimizer_class([anchor], **self.kwargs)
        except Exception as err:
            raise ValueError(f"{where}: {err}") from err
        if not isinstance(optimizer, Optimizer):
            raise ValueError(f"{where}: it returned a {type(optimizer).__name__}, not a torch.optim.Optimizer")
        return optimizer

    @property
    def description(self) -> str:
        """``Class(kwargs)``, for messages."""
        return f"{_name(self.optimizer_class)}({', '.join(f'{k}={v!r}' for k, v in self.kwargs.items())})"

    @property
    def anchor(self) -> Tensor | None:
        """The start-of-round parameters the optimizer updates (``None`` before :meth:`bind`)."""
        return self._anchor

    def bind(self, anchor: Tensor) -> None:
        """Optimize ``anchor`` (a flat tensor, updated in place) from now on; state loaded earlier is applied."""
        self._anchor = anchor
        self._optimizer = self._build(anchor)
        if self._pending_state is not None:
            self._optimizer.load_state_dict(self._pending_state)
            self._pending_state = None

    def step(self, pseudo_gradient: Tensor) -> None:
        """One outer step: ``anchor <- optimizer step with gradient pseudo_gradient``."""
        if self._optimizer is None or self._anchor is None:
            raise RuntimeError("OuterOptimizer.step before bind")
        self._anchor.grad = pseudo_gradient.to(dtype=self._anchor.dtype, device=self._anchor.device)
        self._optimizer.step()
        self._anchor.grad = None

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state (e.g. Nesterov momentum), for checkpoints; ``{}`` before :meth:`bind`."""
        if self._optimizer is None:
            return dict(self._pending_state or {})
        return self._optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (applied at :meth:`bind` when not bound yet)."""
        if not state:
            return
        if self._optimizer is None:
            self._pending_state = state
        else:
            self._optimizer.load_state_dict(state)
