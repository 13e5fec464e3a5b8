"""A worker's side of asynchronous training (ASP): one push-and-pull round trip with the parameter server per update.

:class:`AsynchronousClient` owns the worker's two messages (see :mod:`~lightning_hetero.asp.protocol`); it pushes the
flat gradient and writes the server's reply into the model's flat parameters, directly when the server lives in the
same process (rank 0) and over the server's gloo group otherwise.

Example::

    >>> import torch
    >>> from lightning_hetero.asp.layout import FlatLayout
    >>> from lightning_hetero.asp.server import ParameterServer
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

import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from lightning_hetero.asp.faults import LOST_WORKER_GRACE_S
from lightning_hetero.asp.layout import flatten_grads_into
from lightning_hetero.asp.protocol import (
    FLAG_LAST,
    FLAG_PULL_ONLY,
    STATUS_ABORTED,
    STATUS_OK,
    PeerLostError,
    ReplyHeader,
    new_message,
    payload,
    read_push_header,
    request_report,
    send_done,
    start_push_and_pull,
    wait_push_and_pull,
    write_push_header,
)
from lightning_hetero.asp.server import ParameterServer
from lightning_hetero.asp.sharding import Shard


class AsynchronousClient:
    """Round trips to the parameter server (each of its shards); each reply's parameters land in ``flat``.

    Args:
        flat: the model's flat parameters (the parameters are views of it).
        rank: this worker's global rank.
        server: the server (shard) this rank hosts, if any: rank 0's, or with ``shards`` rank ``s``'s shard ``s``.
        group: the server's gloo process group (used to reach servers in other ranks).
        timeout_s: how long a remote worker waits for the server (``fault_timeout_s``).
        lost_cause: maps a broken connection to the error to raise (the rank lost first, when known).
        recorded_fault: the first fault rank 0 recorded, waiting at most the given seconds (``None`` if none).
        pin_memory: page-locked messages (faster GPU staging).
        overlap: ``False`` (textbook ASP): :meth:`push` returns once the server's reply for this gradient is in
            ``flat``. ``True``: :meth:`push` hands the gradient to a helper thread and returns at once; it is sent
            and the reply travels while the next batch is fetched and computed, and lands in ``flat`` at the next
            :meth:`push` (before that gradient is sent). Each gradient is therefore computed on parameters that
            hold every one of this worker's own updates but the previous one: a bounded extra staleness of one own
            update (plus the other workers' updates applied while it was in flight). A push flagged ``FLAG_LAST``,
            :meth:`pull`, :meth:`leave` and :meth:`close` wait for the update in flight first, so an epoch ends on
            the server's parameters.
        shards: the server's shards (:func:`~lightning_hetero.asp.sharding.plan_shards`; shard ``s`` lives in rank
            ``s``); ``None``: one server in rank 0. Every push and pull goes to every shard with the shard's slice;
            the reply's header has shard 0's version, the largest staleness and the worst status of the shards'.

    Example (``overlap=True``: the first update lands in ``flat`` at the second push)::

        >>> import torch
        >>> from lightning_hetero.asp.server import ParameterServer
        >>> from lightning_hetero.asp.layout import FlatLayout
        >>> param = torch.nn.Parameter(torch.ones(1))
        >>> flat = param.detach().clone()
        >>> server = ParameterServer(FlatLayout.from_named_parameters([("w", param)]), flat,
        ...     torch.optim.SGD([param], lr=0.5), {id(param): 0}, world_size=1)
        >>> client = AsynchronousClient(flat, rank=0, server=server, group=None, timeout_s=1.0,
        ...     lost_cause=lambda err: err, recorded_fault=lambda wait_s: None, overlap=True)
        >>> param.grad = torch.ones(1)
        >>> [client.push([param], 0, base_version=v, share=1.0).version for v in (0, 0)], flat.tolist()
        ([0, 1], [0.5])
        >>> client.close(); flat.tolist(), server.tracker.summary()["staleness_max"]
        ([0.0], 1)
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
        overlap: bool = False,
        shards: Sequence[Shard] | None = None,
    ) -> None:
        self.flat = flat
        self.rank = rank
        self.server = server
        self.group = group
        self.timeout = timedelta(seconds=timeout_s)
        self._lost_cause = lost_cause
        self._recorded_fault = recorded_fault
        self.overlap = overlap
        self._sharded = shards is not None
        plan = shards if shards is not None else [Shard(0, 0, flat.numel(), 0, 0)]
        self._endpoints = [
            _Endpoint(shard, flat, server if shards is None or shard.index == rank else None, pin_memory, overlap, rank)
            for shard in plan
        ]
        # an exchange was started and its replies are not in ``flat`` yet
        self._pending = False

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
            base_version: the server version the gradients were computed on (with shards, each shard's base is the
                version of its slice the gradients were computed on, which the client keeps).
            share: this worker's batch share (``b_k / sum(b)``).
            epoch: the epoch of the gradients' batch.
            chunk: the batch's chunk of the epoch's order (-1 when unknown).
        """
        bases = [endpoint.version if self._sharded else base_version for endpoint in self._endpoints]
        previous = self._complete()
        for endpoint, base in zip(self._endpoints, bases, strict=True):
            mine = params[endpoint.shard.first : endpoint.shard.last] if self._sharded else params
            flatten_grads_into(mine, payload(endpoint.push))
            write_push_header(endpoint.push, flags, base, share, epoch, chunk)
        if not self.overlap or flags & FLAG_LAST:
            return self._exchange()
        self._start()
        # what ``flat`` holds now: the previous update's reply, or still ``base_version``'s parameters
        return previous if previous is not None else ReplyHeader(STATUS_OK, base_version, 0, -1)

    def pull(self, version: int, flags: int = 0) -> ReplyHeader:
        """Receive the latest parameters without pushing a gradient (``flags`` may add ``FLAG_JOIN``)."""
        self._complete()
        for endpoint in self._endpoints:
            write_push_header(endpoint.push, FLAG_PULL_ONLY | flags, version, 0.0)
        return self._exchange()

    def settle(self) -> None:
        """Wait for the update in flight, if any (its reply lands in ``flat``): the server applied every push this
        rank made (a validation point inside an epoch, where no push is flagged ``FLAG_LAST``)."""
        self._complete()

    def report(self, shard: int) -> dict[str, Any]:
        """Shard ``shard``'s :meth:`~lightning_hetero.asp.server.ParameterServer.report` (asked over the network when
        another rank hosts it).

        Args:
            shard: the shard's number (0 without sharding).
        """
        self._complete()
        endpoint = self._endpoints[shard]
        if endpoint.server is not None:
            return endpoint.server.report()
        assert self.group is not None
        try:
            return request_report(endpoint.push, endpoint.host, self.group, self.timeout)
        except PeerLostError as err:
            raise self._lost_cause(err) from err

    def leave(self) -> None:
        """Tell every server (shard) in another rank that this worker leaves (their receiving threads for it end)."""
        self.close()
        for endpoint in self._endpoints:
            if endpoint.server is None:
                assert self.group is not None
                send_done(endpoint.push, endpoint.host, self.group, self.timeout)

    def close(self) -> None:
        """Absorb the update in flight, if any, and end the round-trip threads (``overlap=True``)."""
        self._complete()
        for endpoint in self._endpoints:
            endpoint.close()

    def _exchange(self) -> ReplyHeader:
        """Send the filled push messages to the server(s) and absorb the replies."""
        self._start()
        header = self._complete()
        assert header is not None
        return header

    def _start(self) -> None:
        """Send the filled push messages (the remote ones first); the replies are absorbed by :meth:`_complete`."""
        for endpoint in sorted(self._endpoints, key=lambda e: e.server is not None):
            if endpoint.copied is not None:  # the next reply overwrites the pinned buffer the device still reads
                endpoint.copied.synchronize()
                endpoint.copied = None
            if endpoint.helper is not None:
                endpoint.helper.start(self._round_trip(endpoint))
            elif endpoint.server is not None:
                endpoint.header = endpoint.server.apply(
                    self.rank, read_push_header(endpoint.push), payload(endpoint.push), endpoint.reply
                )
            else:
                assert self.group is not None
                try:
                    endpoint.requests = start_push_and_pull(endpoint.push, endpoint.reply, endpoint.host, self.group)
                except PeerLostError as err:
                    raise self._lost_cause(err) from err
        self._pending = True

    def _complete(self) -> ReplyHeader | None:
        """Wait for the exchange in flight and write its parameters into ``flat``; its (combined) header, ``None`` if
        none."""
        if not self._pending:
            return None
        self._pending = False
        headers = [self._wait(endpoint) for endpoint in self._endpoints]
        for header in headers:
            if header.status == STATUS_ABORTED:
                lost = self.server.lost if self.server is not None else None
                if lost is not None:
                    raise PeerLostError(lost.rank, lost.role, lost.cause)
                recorded = self._recorded_fault(LOST_WORKER_GRACE_S)
                if recorded is not None and recorded.rank == header.lost_rank:
                    raise recorded
                raise PeerLostError(header.lost_rank, "worker", "reported by the parameter server")
        for endpoint, header in zip(self._endpoints, headers, strict=True):
            endpoint.flat.copy_(payload(endpoint.reply), non_blocking=endpoint.reply.is_pinned())
            if endpoint.reply.is_pinned() and endpoint.flat.is_cuda:  # the copy runs later on the device's stream
                endpoint.copied = torch.cuda.Event()
                endpoint.copied.record()
            endpoint.version = header.version
        return ReplyHeader(
            max(header.status for header in headers), headers[0].version, max(h.staleness for h in headers), -1
        )

    def _round_trip(self, endpoint: _Endpoint) -> Callable[[], ReplyHeader]:
        """``endpoint``'s whole exchange, run by its helper thread (``overlap=True``): the in-process server's update,
        or the remote server's send, its update and the reply (gloo's send of a large message blocks its caller for
        about as long as the transfer takes: milliseconds for a megabyte on a loaded host)."""
        push, reply, server = endpoint.push, endpoint.reply, endpoint.server
        if server is not None:
            return lambda: server.apply(self.rank, read_push_header(push), payload(push), reply)
        group, host, timeout = self.group, endpoint.host, self.timeout
        assert group is not None
        return lambda: wait_push_and_pull(start_push_and_pull(push, reply, host, group), reply, host, timeout)

    def _wait(self, endpoint: _Endpoint) -> ReplyHeader:
        if endpoint.helper is not None:
            try:
                return endpoint.helper.wait()
            except PeerLostError as err:
                raise self._lost_cause(err) from err
        if endpoint.requests is not None:
            requests, endpoint.requests = endpoint.requests, None
            try:
                return wait_push_and_pull(requests, endpoint.reply, endpoint.host, self.timeout)
            except PeerLostError as err:
                raise self._lost_cause(err) from err
        assert endpoint.header is not None
        return endpoint.header


class _Endpoint:
    """One server shard as a worker sees it: its slice of ``flat``, its two messages, and the in-process server (the
    shard this rank hosts) or the rank hosting it.

    Args:
        shard: the shard.
        flat: the model's flat parameters.
        server: the shard's server when it lives in this process, else ``None``.
        pin_memory: page-locked messages.
        overlap: whether a helper thread runs the round trips (while the worker computes its next batch).
        rank: this worker's global rank.
    """

    def __init__(
        self,
        shard: Shard,
        flat: torch.Tensor,
        server: ParameterServer | None,
        pin_memory: bool,
        overlap: bool,
        rank: int,
    ) -> None:
        self.shard = shard
        self.host = shard.index
        self.flat = flat[shard.start : shard.stop]
        self.server = server
        self.push = new_message(shard.numel, pin_memory=pin_memory)
        self.reply = new_message(shard.numel, pin_memory=pin_memory)
        #: ``overlap=True``: the thread that runs this shard's round trips while the worker computes
        self.helper = _RoundTripThread(f"ps-round-trip-{rank}-{shard.index}") if overlap else None
        self.requests: tuple[dist.Work, dist.Work] | None = None  # gloo's, for a remote shard
        self.header: ReplyHeader | None = None  # the in-process server's answer, without overlap
        self.copied: Any = None  # CUDA: an event after the reply's copy into ``flat`` (see `_start`)
        #: the shard's version of the parameters in ``flat``'s slice
        self.version = 0

    def close(self) -> None:
        if self.helper is not None:
            self.helper.close()
            self.helper = None


class _RoundTripThread:
    """Runs a worker's round trips one at a time (``overlap=True``), so that the worker computes its next batch
    meanwhile: the in-process server's update of rank 0's own push, or the exchange with a server in another rank.

    Args:
        name: the thread's name.
    """

    def __init__(self, name: str) -> None:
        self._cond = threading.Condition()
        self._job: Callable[[], ReplyHeader] | None = None
        self._result: ReplyHeader | BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def start(self, job: Callable[[], ReplyHeader]) -> None:
        with self._cond:
            self._job, self._result = job, None
            self._cond.notify_all()

    def wait(self) -> ReplyHeader:
        with self._cond:
            self._cond.wait_for(lambda: self._result is not None)
            result, self._result = self._result, None
        if isinstance(result, BaseException):
            raise result
        assert result is not None
        return result

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._job is not None or self._closed)
                if self._job is None:
                    return
                job, self._job = self._job, None
            try:
                result: ReplyHeader | BaseException = job()
            except BaseException as err:  # handed to the waiting worker, which raises it
                result = err
            with self._cond:
                self._result = result
                self._cond.notify_all()
