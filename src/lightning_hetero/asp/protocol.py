"""The parameter server's wire protocol: one flat float32 message per push and per pull, over torch.distributed.

A message is ``[header (6 slots) | payload (the flat parameters or gradients)]``. Integer header fields are stored
bit-exactly through an int32 view of the float32 buffer, so versions never lose precision. Pushes travel with tag
:data:`TAG_PUSH` from a worker to the server's rank, replies with :data:`TAG_REPLY` back; both use a gloo process
group dedicated to the server (CPU tensors; GPU workers stage through a CPU buffer). One function per pattern.

Example::

    >>> msg = new_message(3)
    >>> write_push_header(msg, flags=FLAG_LAST, base_version=41, share=0.25, epoch=2, chunk=7)
    >>> read_push_header(msg)
    PushHeader(flags=1, base_version=41, share=0.25, epoch=2, chunk=7)
    >>> payload(msg).numel()
    3
"""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

HEADER_SLOTS = 6
#: the global rank that hosts the parameter server (and the key-value store of claims and faults)
SERVER_RANK = 0
TAG_PUSH = 71
TAG_REPLY = 72
TAG_REPORT = 73

#: push flags
FLAG_LAST = 1  # the worker's last update of the epoch: it stops holding others back
FLAG_PULL_ONLY = 2  # no gradient: just send the latest parameters
FLAG_DONE = 4  # the worker leaves; the server's thread for it ends
FLAG_JOIN = 8  # with FLAG_PULL_ONLY: the worker starts an epoch and counts for the staleness bound from now on
FLAG_REPORT = 16  # no gradient: the server answers with its report (state and statistics) as a pickled object
FLAG_SKIPPED = 32  # fp16's GradScaler skipped the step (inf/NaN gradient): no update, but FLAG_LAST still counts

#: reply statuses
STATUS_OK = 0
STATUS_STOPPED = 1  # the update budget (``max_steps``) is spent; the gradient was not applied
STATUS_ABORTED = 2  # another rank was lost; the header names it


class PushHeader(NamedTuple):
    flags: int
    base_version: int
    share: float
    epoch: int = -1  # the epoch the gradient's batch belongs to
    chunk: int = -1  # the batch's chunk of the epoch's order (``ClaimSampler``), -1 when unknown


class ReplyHeader(NamedTuple):
    status: int
    version: int
    staleness: int
    lost_rank: int


class PeerLostError(RuntimeError):
    """A rank stopped answering or its connection broke.

    Args:
        rank: the lost global rank.
        role: ``"worker"`` or ``"parameter server"``.
        cause: what was observed.
    """

    def __init__(self, rank: int, role: str, cause: str) -> None:
        super().__init__(f"AsyncPSStrategy lost the {role} on rank {rank}: {cause}")
        self.rank = rank
        self.role = role
        self.cause = cause


def new_message(numel: int, pin_memory: bool = False) -> torch.Tensor:
    """A zeroed CPU message with room for the header and ``numel`` payload elements.

    Args:
        numel: payload length (the flat parameter count).
        pin_memory: allocate page-locked memory (faster GPU staging).
    """
    return torch.zeros(HEADER_SLOTS + numel, dtype=torch.float32, pin_memory=pin_memory)


def payload(msg: torch.Tensor) -> torch.Tensor:
    return msg[HEADER_SLOTS:]


def write_push_header(
    msg: torch.Tensor, flags: int, base_version: int, share: float, epoch: int = -1, chunk: int = -1
) -> None:
    """Fill a push's header.

    Args:
        msg: the message.
        flags: OR of ``FLAG_*``.
        base_version: the server version the gradient was computed on.
        share: this worker's share of the global batch (``b_k / sum(b)``).
        epoch: the epoch of the gradient's batch.
        chunk: the batch's chunk number in the epoch's order (-1 when unknown).
    """
    ints = msg[:HEADER_SLOTS].view(torch.int32)
    ints[0], ints[1], ints[3], ints[4] = flags, base_version, epoch, chunk
    msg[2] = share


def read_push_header(msg: torch.Tensor) -> PushHeader:
    ints = msg[:HEADER_SLOTS].view(torch.int32).tolist()
    return PushHeader(flags=ints[0], base_version=ints[1], share=float(msg[2]), epoch=ints[3], chunk=ints[4])


def write_reply_header(msg: torch.Tensor, status: int, version: int, staleness: int, lost_rank: int = -1) -> None:
    """Fill a reply's header.

    Args:
        msg: the message.
        status: one of ``STATUS_*``.
        version: the server version the payload's parameters have.
        staleness: the staleness the pushed update was applied with.
        lost_rank: the lost rank when ``status`` is ``STATUS_ABORTED``.
    """
    msg[:4].view(torch.int32)[:] = torch.tensor([status, version, staleness, lost_rank], dtype=torch.int32)


def read_reply_header(msg: torch.Tensor) -> ReplyHeader:
    return ReplyHeader(*msg[:4].view(torch.int32).tolist())


def push_and_pull(
    push_msg: torch.Tensor, reply_msg: torch.Tensor, server_rank: int, group: dist.ProcessGroup, timeout: timedelta
) -> ReplyHeader:
    """Worker side: send one push and wait (at most ``timeout`` each) for the server's reply.

    Args:
        push_msg: the filled push message.
        reply_msg: receives the reply (header and parameters).
        server_rank: the server's global rank.
        group: the server's process group.
        timeout: how long to wait before declaring the server lost.

    Raises:
        PeerLostError: the server's connection broke or it did not answer in time.
    """
    return wait_push_and_pull(
        start_push_and_pull(push_msg, reply_msg, server_rank, group), reply_msg, server_rank, timeout
    )


def start_push_and_pull(
    push_msg: torch.Tensor, reply_msg: torch.Tensor, server_rank: int, group: dist.ProcessGroup
) -> tuple[dist.Work, dist.Work]:
    """Worker side: post one push and the receive of its reply, and return at once (gloo moves the bytes on its own
    threads); neither message may be touched until :func:`wait_push_and_pull` returns.

    Args:
        push_msg: the filled push message.
        reply_msg: receives the reply (header and parameters).
        server_rank: the server's global rank.
        group: the server's process group.

    Raises:
        PeerLostError: the server's connection is broken.
    """
    try:
        send = dist.isend(push_msg, dst=server_rank, group=group, tag=TAG_PUSH)
        recv = dist.irecv(reply_msg, src=server_rank, group=group, tag=TAG_REPLY)
    except RuntimeError as err:
        raise PeerLostError(server_rank, "parameter server", str(err).splitlines()[0]) from err
    return send, recv


def wait_push_and_pull(
    requests: tuple[dist.Work, dist.Work], reply_msg: torch.Tensor, server_rank: int, timeout: timedelta
) -> ReplyHeader:
    """Worker side: wait (at most ``timeout`` each) for a push posted by :func:`start_push_and_pull` and its reply.

    Args:
        requests: what :func:`start_push_and_pull` returned.
        reply_msg: the reply message given there.
        server_rank: the server's global rank.
        timeout: how long to wait before declaring the server lost.

    Raises:
        PeerLostError: the server's connection broke or it did not answer in time.
    """
    try:
        for request in requests:
            request.wait(timeout)
    except RuntimeError as err:
        raise PeerLostError(server_rank, "parameter server", str(err).splitlines()[0]) from err
    return read_reply_header(reply_msg)


def send_done(push_msg: torch.Tensor, server_rank: int, group: dist.ProcessGroup, timeout: timedelta) -> None:
    """Worker side: tell the server this worker leaves (no reply).

    Args:
        push_msg: a push-sized message (its payload is ignored).
        server_rank: the server's global rank.
        group: the server's process group.
        timeout: how long the send may take.
    """
    write_push_header(push_msg, FLAG_DONE, 0, 0.0)
    try:
        dist.isend(push_msg, dst=server_rank, group=group, tag=TAG_PUSH).wait(timeout)
    except RuntimeError as err:
        raise PeerLostError(server_rank, "parameter server", str(err).splitlines()[0]) from err


def receive_push(msg: torch.Tensor, worker_rank: int, group: dist.ProcessGroup) -> PushHeader:
    """Server side: block until ``worker_rank``'s next push lands in ``msg``.

    Args:
        msg: a push-sized message for this worker.
        worker_rank: the worker's global rank.
        group: the server's process group.

    Raises:
        PeerLostError: the worker's connection broke.
    """
    try:
        dist.recv(msg, src=worker_rank, group=group, tag=TAG_PUSH)
    except RuntimeError as err:
        raise PeerLostError(worker_rank, "worker", str(err).splitlines()[0]) from err
    return read_push_header(msg)


def send_reply(msg: torch.Tensor, worker_rank: int, group: dist.ProcessGroup, timeout: timedelta) -> None:
    """Server side: send a filled reply to ``worker_rank``.

    Args:
        msg: the reply message.
        worker_rank: the worker's global rank.
        group: the server's process group.
        timeout: how long the send may take.

    Raises:
        PeerLostError: the worker's connection broke.
    """
    try:
        dist.isend(msg, dst=worker_rank, group=group, tag=TAG_REPLY).wait(timeout)
    except RuntimeError as err:
        raise PeerLostError(worker_rank, "worker", str(err).splitlines()[0]) from err


def request_report(
    push_msg: torch.Tensor, server_rank: int, group: dist.ProcessGroup, timeout: timedelta
) -> dict[str, Any]:
    """Ask a remote server (shard) for its report: a push flagged :data:`FLAG_REPORT`, answered with a size and then
    the pickled object (:func:`send_report`).

    Args:
        push_msg: a push-sized message for that server (its payload is ignored).
        server_rank: the server's global rank.
        group: the server's process group.
        timeout: how long each transfer may take.

    Raises:
        PeerLostError: the server's connection broke or it did not answer in time.
    """
    write_push_header(push_msg, FLAG_PULL_ONLY | FLAG_REPORT, 0, 0.0)
    size = torch.zeros(1, dtype=torch.int64)
    try:
        dist.isend(push_msg, dst=server_rank, group=group, tag=TAG_PUSH).wait(timeout)
        dist.irecv(size, src=server_rank, group=group, tag=TAG_REPORT).wait(timeout)
        data = torch.empty(int(size), dtype=torch.uint8)
        dist.irecv(data, src=server_rank, group=group, tag=TAG_REPORT).wait(timeout)
    except RuntimeError as err:
        raise PeerLostError(server_rank, "parameter server", str(err).splitlines()[0]) from err
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False)


def send_report(report: dict[str, Any], worker_rank: int, group: dist.ProcessGroup, timeout: timedelta) -> None:
    """Server side: answer :func:`request_report` with ``report`` (pickled).

    Args:
        report: the server's report.
        worker_rank: the asking worker's global rank.
        group: the server's process group.
        timeout: how long each send may take.

    Raises:
        PeerLostError: the worker's connection broke.
    """
    buffer = io.BytesIO()
    torch.save(report, buffer)
    data = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    try:
        dist.isend(torch.tensor([data.numel()], dtype=torch.int64), dst=worker_rank, group=group, tag=TAG_REPORT).wait(
            timeout
        )
        dist.isend(data, dst=worker_rank, group=group, tag=TAG_REPORT).wait(timeout)
    except RuntimeError as err:
        raise PeerLostError(worker_rank, "worker", str(err).splitlines()[0]) from err
