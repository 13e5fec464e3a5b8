"""``torch.compile`` with per-rank batch sizes that change: the batch dimension marked dynamic, recompiles watched.

A compiled model specialises on input shapes: each new batch size would compile again (and torch's global limit
stops recompiling after a few). HeteroBatch therefore marks the first dimension of each batch's tensors dynamic
(:func:`mark_batch_dynamic`, ``torch._dynamo.maybe_mark_dynamic``: a model that needs a static size keeps it), draws
sizes from multiples of ``batch_size_multiple`` (8 by default on CUDA), and :class:`RecompileWatch` warns, naming the
rank, when this process has compiled more graphs than a bound since the fit started.

Example::

    >>> import torch
    >>> batch = (torch.zeros(16, 3), torch.zeros(16, dtype=torch.long))
    >>> mark_batch_dynamic(batch, size=16)
    2
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

log = logging.getLogger("lightning_hetero.hetero_batch")

#: compiled graphs per rank beyond which :class:`RecompileWatch` warns
RECOMPILE_BOUND = 8


def mark_batch_dynamic(batch: Any, size: int) -> int:
    """Mark dimension 0 of every tensor in ``batch`` whose first dimension is ``size`` as dynamic (sizes under 2
    are left: torch specialises them); returns how many tensors were marked."""
    if size < 2:
        return 0
    if isinstance(batch, torch.Tensor):
        if batch.dim() > 0 and batch.shape[0] == size:
            torch._dynamo.maybe_mark_dynamic(batch, 0)
            return 1
        return 0
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, tuple | list) else ()
    return sum(mark_batch_dynamic(item, size) for item in items)


def compiled_graphs() -> int:
    """Graphs ``torch.compile`` has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class RecompileWatch:
    """Warns once, naming the rank, when more than ``bound`` graphs were compiled since it was made.

    Args:
        rank: the rank named in the warning.
        bound: graphs allowed before the warning.

    Example::

        >>> watch = RecompileWatch(rank=1, bound=8)
        >>> watch.check(), watch.warned
        (0, False)
    """

    def __init__(self, rank: int, bound: int = RECOMPILE_BOUND) -> None:
        self.rank, self.bound = rank, bound
        self.start = compiled_graphs()
        self.warned = False

    def check(self) -> int:
        """Graphs compiled since the start; warns the first time they pass the bound."""
        compiled = compiled_graphs() - self.start
        if compiled > self.bound and not self.warned:
            self.warned = True
            log.warning(
                f"HeteroBatch: rank {self.rank} has compiled {compiled} graphs (more than {self.bound}): its batch "
                "sizes change faster than torch.compile's dynamic shapes absorb; set batch_size_multiple higher"
            )
        return compiled
