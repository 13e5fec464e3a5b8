"""The flat layout of a model's trainable parameters: one contiguous buffer instead of one tensor per parameter.

Everything the parameter server sends or stores is a single flat float32 vector laid out by a :class:`FlatLayout`,
so a push or a pull is one message whatever the number of parameters.

Example::

    >>> import torch
    >>> layout = FlatLayout.from_named_parameters([("w", torch.zeros(2, 3)), ("b", torch.zeros(3))])
    >>> layout.numel, layout.offsets
    (9, (0, 6))
    >>> [tuple(v.shape) for v in layout.views(torch.arange(9.0))]
    [(2, 3), (3,)]
    >>> model = torch.nn.Linear(2, 1)
    >>> flat = flatten_model(model)
    >>> flat.layout.names, flat.flat.numel(), model.weight.data_ptr() == flat.flat.data_ptr()
    (('weight', 'bias'), 3, True)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FlatLayout:
    """Names, shapes and offsets of parameters packed end to end into one vector.

    Args:
        names: parameter names, as ``named_parameters()`` gives them.
        shapes: the shape of each parameter.
    """

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]

    @classmethod
    def from_named_parameters(cls, named_parameters: Iterable[tuple[str, torch.Tensor]]) -> FlatLayout:
        """Build the layout of the given parameters, in order.

        Args:
            named_parameters: ``(name, tensor)`` pairs, e.g. ``module.named_parameters()``.
        """
        pairs = list(named_parameters)
        return cls(tuple(name for name, _ in pairs), tuple(tensor.shape for _, tensor in pairs))

    @property
    def numels(self) -> tuple[int, ...]:
        return tuple(int(torch.Size(shape).numel()) for shape in self.shapes)

    @property
    def offsets(self) -> tuple[int, ...]:
        offsets, total = [], 0
        for numel in self.numels:
            offsets.append(total)
            total += numel
        return tuple(offsets)

    @property
    def numel(self) -> int:
        return sum(self.numels)

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of ``flat`` shaped like each parameter (writes through to ``flat``).

        Args:
            flat: a 1-D tensor of exactly :attr:`numel` elements.
        """
        if flat.dim() != 1 or flat.numel() != self.numel:
            raise ValueError(f"expected a flat tensor of {self.numel} elements, got shape {tuple(flat.shape)}")
        return [chunk.view(shape) for chunk, shape in zip(flat.split(list(self.numels)), self.shapes, strict=True)]


def flatten_grads_into(params: Sequence[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """Copy the parameters' gradients end to end into ``out`` (a missing gradient counts as zero).

    Args:
        params: parameters in layout order.
        out: a 1-D tensor with as many elements as the parameters together; its dtype and device may differ.

    Example::

        >>> import torch
        >>> a, b = torch.zeros(2, requires_grad=True), torch.zeros(1, requires_grad=True)
        >>> a.grad = torch.tensor([1.0, 2.0])
        >>> flatten_grads_into([a, b], torch.empty(3)).tolist()
        [1.0, 2.0, 0.0]
    """
    grads = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), device=p.device) for p in params]
    if grads and grads[0].device == out.device and grads[0].dtype == out.dtype:
        torch.cat(grads, out=out)
    else:
        out.copy_(torch.cat(grads))
    return out


def bind_parameters_to_flat(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Make each parameter a view into ``flat`` (values copied first), so that one copy into ``flat`` updates them all.

    Args:
        params: parameters in layout order, all on ``flat``'s device and of its dtype.
        flat: a 1-D tensor with as many elements as the parameters together.

    Example::

        >>> import torch
        >>> p = torch.nn.Parameter(torch.ones(2))
        >>> flat = torch.zeros(2)
        >>> bind_parameters_to_flat([p], flat)
        >>> flat.fill_(5.0).tolist(), p.tolist()
        ([5.0, 5.0], [5.0, 5.0])
    """
    offset = 0
    with torch.no_grad():
        for p in params:
            numel = p.numel()
            flat[offset : offset + numel].copy_(p.reshape(-1))
            p.data = flat[offset : offset + numel].view_as(p)
            offset += numel
    if offset != flat.numel():
        raise ValueError(f"parameters hold {offset} elements but the flat buffer has {flat.numel()}")


@dataclass
class FlatModel:
    """A model's trainable parameters bound to one flat buffer (see :func:`flatten_model`).

    Args:
        layout: names, shapes and offsets of the parameters.
        params: the parameters, in layout order (views of ``flat``).
        flat: the flat parameters.
    """

    layout: FlatLayout
    params: list[torch.Tensor]
    flat: torch.Tensor


def flatten_model(module: torch.nn.Module) -> FlatModel:
    """Lay out ``module``'s trainable parameters in one flat buffer and make them views of it.

    Raises:
        ValueError: the model has no trainable parameters, or they span several devices or dtypes.
    """
    named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    if not named:
        raise ValueError("AsyncPSStrategy: the model has no trainable parameters.")
    kinds = {(p.device, p.dtype) for _, p in named}
    if len(kinds) != 1 or not named[0][1].is_floating_point():
        raise ValueError(
            "AsyncPSStrategy needs all trainable parameters on one device with one floating dtype to lay them "
            f"out in a flat buffer; found {sorted(str(k) for k in kinds)}."
        )
    layout = FlatLayout.from_named_parameters(named)
    params = [p for _, p in named]
    flat = torch.empty(layout.numel, dtype=params[0].dtype, device=params[0].device)
    bind_parameters_to_flat(params, flat)
    return FlatModel(layout, params, flat)
