"""A worker's model as the elastic job sees it: its trainable parameters and float buffers, and whether a joining
worker's model is the running job's (the trainable parameters' names and shapes)."""

from __future__ import annotations

import torch
from torch.nn.utils import parameters_to_vector

from lightning_hetero.elastic.membership import ElasticError


def trainable_params(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the job trains, in the module's order."""
    return [p for p in module.parameters() if p.requires_grad]


def float_buffers(module: torch.nn.Module) -> list[torch.Tensor]:
    """The buffers the job averages (as batch norm's running statistics), in the module's order."""
    return [b for b in module.buffers() if b.is_floating_point()]


def flat_params(module: torch.nn.Module) -> torch.Tensor:
    """The trainable parameters in one detached vector.

    Example::

        >>> flat_params(torch.nn.Linear(3, 2)).shape
        torch.Size([8])
    """
    return parameters_to_vector(trainable_params(module)).detach()


def check_joining_model(module: torch.nn.Module, job_signature: dict[str, list[int]]) -> None:
    """Raises :class:`ElasticError` naming the first difference when ``module`` is not the running job's model."""
    mismatch = signature_mismatch(model_signature(module), job_signature)
    if mismatch is not None:
        raise ElasticError(f"this worker cannot join the elastic job: its model differs: {mismatch}")


def model_signature(module: torch.nn.Module) -> dict[str, list[int]]:
    """The trainable parameters' shapes by name (what a joining worker's model is checked against).

    Example::

        >>> model_signature(torch.nn.Linear(3, 2))
        {'weight': [2, 3], 'bias': [2]}
    """
    return {name: list(p.shape) for name, p in module.named_parameters() if p.requires_grad}


def signature_mismatch(own: dict[str, list[int]], job: dict[str, list[int]]) -> str | None:
    """The first difference between this worker's model and the running job's, in words (``None``: they match).

    Example::

        >>> signature_mismatch({"w": [4, 8]}, {"w": [4, 16]})
        'parameter w has shape [4, 8] here and [4, 16] in the running job'
        >>> signature_mismatch({"w": [4]}, {"w": [4], "b": [2]})
        'parameter b of the running job is missing here'
    """
    for name, shape in job.items():
        if name not in own:
            return f"parameter {name} of the running job is missing here"
        if own[name] != shape:
            return f"parameter {name} has shape {own[name]} here and {shape} in the running job"
    extra = sorted(set(own) - set(job))
    return f"parameter {extra[0]} is not in the running job's model" if extra else None
