"""Ranks that share one GPU: each one's CUDA-event step times include the time the others' kernels held the device.

A GPU runs one process's kernels at a time (without MPS), so when two ranks share it, a rank's events span the other
rank's work too: the fast rank looks slower than it is and the split comes out too even. Measured on one H200 with
two ranks, rank 1 slowed 3x: HeteroBatch settled at 176/80 where the best fixed split tried was 208/48, 0.83 of its
throughput (docs/results.md, "GPU"). At fit start each CUDA rank's device is identified (host and GPU UUID), the ids
are gathered, and ranks that share a device are warned about once; nothing else changes.

Example::

    >>> shared_devices(["a/GPU-1", "a/GPU-1", "b/GPU-1", "a/GPU-2"])
    [[0, 1]]
    >>> shared_devices(["", ""])  # not CUDA: never shared
    []
"""

from __future__ import annotations

import hashlib
import logging
import socket

import torch
from lightning.pytorch.strategies import Strategy

from lightning_hetero.hetero_batch.exchange import gather_rows
from lightning_hetero.measurement import BusyTimer

log = logging.getLogger(__name__)


def device_id(device: torch.device) -> str:
    """This process's GPU as ``"<host>/<uuid>"``; ``""`` when ``device`` is not CUDA.

    Example::

        >>> device_id(torch.device("cpu"))
        ''
    """
    if device.type != "cuda":
        return ""
    return f"{socket.gethostname()}/{torch.cuda.get_device_properties(device).uuid}"


def shared_devices(ids: list[str]) -> list[list[int]]:
    """The groups of ranks (two or more, in rank order) whose ``ids`` are equal and not empty."""
    groups: dict[str, list[int]] = {}
    for rank, ident in enumerate(ids):
        if ident:
            groups.setdefault(ident, []).append(rank)
    return [ranks for ranks in groups.values() if len(ranks) > 1]


def _key(ident: str) -> int:
    """A 60-bit integer for ``ident`` (0 for ``""``), to gather as a tensor on any backend."""
    return int(hashlib.sha1(ident.encode()).hexdigest()[:15], 16) if ident else 0


def shared_device_warning(ids: list[str]) -> str | None:
    """The warning for the ranks of ``ids`` (one per rank) that share a GPU; ``None`` when none do.

    Example::

        >>> shared_device_warning(["h/GPU-1", "h/GPU-1"])[:45]
        'HeteroBatch: ranks 0, 1 share one GPU. Each r'
        >>> shared_device_warning(["h/GPU-1", "h/GPU-2"]) is None
        True
    """
    groups = shared_devices(ids)
    if not groups:
        return None
    names = "; ".join("ranks " + ", ".join(map(str, ranks)) for ranks in groups)
    return (
        f"HeteroBatch: {names} share one GPU. Each rank's step times then include the others' kernels, so the split "
        "comes out too even (0.83 of the best fixed split measured on one H200); give each rank its own GPU"
    )


def warn_shared_devices(strategy: Strategy, device: torch.device, busy: BusyTimer) -> str | None:
    """Gather every rank's device id (:func:`~.exchange.gather_rows`, the time a wait of ``busy``); rank 0 logs
    :func:`shared_device_warning`, which every rank returns. Collective on CUDA (every rank calls it); elsewhere
    nothing is gathered."""
    if device.type != "cuda" or strategy.world_size < 2:
        return None
    keys = gather_rows(strategy, torch.tensor([_key(device_id(device))], dtype=torch.int64), busy).reshape(-1)
    warning = shared_device_warning([str(key) if key else "" for key in keys.tolist()])
    if warning and strategy.global_rank == 0:
        log.warning(warning)
    return warning
