"""Whether a joining worker's model is the running job's: the trainable parameters' names and shapes."""

from __future__ import annotations

import torch


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
