"""The parameter server's receiving threads: one per remote worker, each receiving its pushes, applying them to the
:class:`~lightning_hetero.asp.server.ParameterServer` and replying.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Sequence
from datetime import timedelta

import torch.distributed as dist

from lightning_hetero.asp.protocol import (
    FLAG_DONE,
    FLAG_REPORT,
    PeerLostError,
    new_message,
    payload,
    receive_push,
    send_reply,
    send_report,
)
from lightning_hetero.asp.server import ParameterServer


class ServerLoop:
    """One daemon thread per remote worker: receive its push, apply it, reply; a broken connection marks it lost.

    Args:
        server: the state to feed.
        worker_ranks: remote workers' global ranks.
        group: the server's gloo process group.
        reply_timeout: how long sending a reply may take before its worker is declared lost.
        shard_hosts: the ranks that host server shards (a lost one is named as a parameter server, not a worker).
    """

    def __init__(
        self,
        server: ParameterServer,
        worker_ranks: Sequence[int],
        group: dist.ProcessGroup,
        reply_timeout: timedelta,
        shard_hosts: Collection[int] = (),
    ) -> None:
        self.server = server
        self.group = group
        self.reply_timeout = reply_timeout
        self.shard_hosts = frozenset(shard_hosts)
        self._threads = [
            threading.Thread(target=self._serve, args=(rank,), name=f"ps-worker-{rank}", daemon=True)
            for rank in worker_ranks
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def join(self, timeout_s: float) -> bool:
        """Wait for the threads to end (each ends when its worker says it is done, or is lost); whether they did.

        Args:
            timeout_s: the longest wait in all.
        """
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def _serve(self, worker: int) -> None:
        push = new_message(self.server.layout.numel)
        reply = new_message(self.server.layout.numel)
        grad = payload(push)
        try:
            while True:
                header = receive_push(push, worker, self.group)
                if header.flags & FLAG_DONE:
                    return
                if header.flags & FLAG_REPORT:
                    send_report(self.server.report(), worker, self.group, self.reply_timeout)
                    continue
                self.server.apply(worker, header, grad, reply)
                send_reply(reply, worker, self.group, self.reply_timeout)
        except PeerLostError as err:
            if err.rank in self.shard_hosts:
                err = PeerLostError(err.rank, "parameter server", err.cause)
            self.server.fail(err)
