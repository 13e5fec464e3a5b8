"""A worker's side of asynchronous training (ASP): one push-and-pull round trip with the parameter server per update.

:class:`AsynchronousClient` owns the worker's two messages (see :mod:`~lightning_hetero.ps.protocol`); it pushes the
flat gradient and writes the server's reply into the model's flat parameters, directly when the server lives in the
same process (rank 0) and over the server's gloo group otherwise. :class:`RemoteStepOptimizer` is what the user's
optimizer becomes during an asynchronous step: Lightning's loop calls its ``step`` and the update happens remotely.

Example::

    >>> import torch
    >>> from lightning_hetero.ps.layout import FlatLayout
    >>> from lightning_hetero.ps.server import ParameterServer
    >>> param = torch.nn.Parameter(torch.ones(2))
    >>> flat = param.detach().clone()
    >>> server = ParameterServer(FlatLayout.from_named_parameters([("w", param)]), flat,
    ...     torch.optim.SGD([param], lr=0.5), {id(param): 0}, world_size=1)
    >>> client = AsynchronousClient(flat, rank=0, server=server, group=None, timeout_s=1.0,
    ...     lost_cause=lambda err: err, recorded_fault=lambda wait_s: None)
    >>> param.grad = torch.ones(2)
    >>> client.push([param], flags=0, base_version=0, share=1.0).version
    1
    >>> flat.tolist()
    [0.5, 0.5]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.optim import Optimizer

from lightning_hetero.ps.fault_tolerance import LOST_WORKER_GRACE_S
from lightning_hetero.ps.layout import flatten_grads_into
from lightning_hetero.ps.protocol import (
    FLAG_PULL_ONLY,
    SERVER_RANK,
    STATUS_ABORTED,
    PeerLostError,
    ReplyHeader,
    new_message,
    payload,
    push_and_pull,
    read_push_header,
    send_done,
    write_push_header,
)
from lightning_hetero.ps.server import ParameterServer


class RemoteStepOptimizer:
    """Stands in for the user's optimizer in asynchronous mode: ``step`` runs the closure (forward, backward, hooks,
    clipping) and then hands the gradients to the parameter server instead of updating locally.

    Args:
        optimizer: the user's optimizer (every other attribute is read from it).
        remote_step: runs the closure and the update; its result is ``step``'s.
    """

    def __init__(self, optimizer: Optimizer, remote_step: Callable[[Callable[[], Any]], Any]) -> None:
        self._optimizer = optimizer
        self._remote_step = remote_step

    def step(self, closure: Callable[[], Any], **kwargs: Any) -> Any:
        return self._remote_step(closure)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)


class AsynchronousClient:
    """Round trips to the parameter server; each reply's parameters land in ``flat``.

    Args:
        flat: the model's flat parameters (the parameters are views of it).
        rank: this worker's global rank.
        server: the server when it lives in this process (rank 0), else ``None``.
        group: the server's gloo process group (used by remote workers).
        timeout_s: how long a remote worker waits for the server (``fault_timeout_s``).
        lost_cause: maps a broken connection to the error to raise (the rank lost first, when known).
        recorded_fault: the first fault rank 0 recorded, waiting at most the given seconds (``None`` if none).
        pin_memory: page-locked messages (faster GPU staging).
    """

    def __init__(
        self,
        flat: torch.Tensor,
        rank: int,
        server: ParameterServer | None,
        group: dist.ProcessGroup | None,
        timeout_s: float,
        lost_cause: Callable[[BaseException], BaseException],
        recorded_fault: Callable[[float], PeerLostError | None],
        pin_memory: bool = False,
    ) -> None:
        self.flat = flat
        self.rank = rank
        self.server = server
        self.group = group
        self.timeout = timedelta(seconds=timeout_s)
        self._lost_cause = lost_cause
        self._recorded_fault = recorded_fault
        self._push = new_message(flat.numel(), pin_memory=pin_memory)
        self._reply = new_message(flat.numel(), pin_memory=pin_memory)

    def push(
        self,
        params: Sequence[torch.Tensor],
        flags: int,
        base_version: int,
        share: float,
        epoch: int = -1,
        chunk: int = -1,
    ) -> ReplyHeader:
        """Push the parameters' gradients (computed on ``base_version``) and receive the new parameters.

        Args:
            params: the parameters in layout order.
            flags: OR of the protocol's ``FLAG_*``.
            base_version: the server version the gradients were computed on.
            share: this worker's batch share (``b_k / sum(b)``).
            epoch: the epoch of the gradients' batch.
            chunk: the batch's chunk of the epoch's order (-1 when unknown).
        """
        flatten_grads_into(params, payload(self._push))
        write_push_header(self._push, flags, base_version, share, epoch, chunk)
        return self._exchange()

    def pull(self, version: int, flags: int = 0) -> ReplyHeader:
        """Receive the latest parameters without pushing a gradient (``flags`` may add ``FLAG_JOIN``)."""
        write_push_header(self._push, FLAG_PULL_ONLY | flags, version, 0.0)
        return self._exchange()

    def leave(self) -> None:
        """Tell the server this (remote) worker leaves; its receiving thread ends."""
        assert self.group is not None
        send_done(self._push, SERVER_RANK, self.group, self.timeout)

    def _exchange(self) -> ReplyHeader:
        """Send the filled push message to the server and absorb the reply."""
        if self.server is not None:
            header = self.server.apply(self.rank, read_push_header(self._push), payload(self._push), self._reply)
        else:
            assert self.group is not None
            try:
                header = push_and_pull(self._push, self._reply, SERVER_RANK, self.group, self.timeout)
            except PeerLostError as err:
                raise self._lost_cause(err) from err
        if header.status == STATUS_ABORTED:
            lost = self.server.lost if self.server is not None else None
            if lost is not None:
                raise PeerLostError(lost.rank, lost.role, lost.cause)
            recorded = self._recorded_fault(LOST_WORKER_GRACE_S)
            if recorded is not None and recorded.rank == header.lost_rank:
                raise recorded
            raise PeerLostError(header.lost_rank, "worker", "reported by the parameter server")
        self.flat.copy_(payload(self._reply), non_blocking=self._reply.is_pinned())
        return header
