"""Who takes part in each round, on torchft: the lighthouse (hosted here or reached by address), this worker's
``torchft.Manager`` and its fault-tolerant gloo group, and one round-end all-reduce. The only module that imports
torchft (the ``[elastic]`` extra), and only when a membership is built.

A round end is torchft's step: a quorum through the lighthouse (a worker behind the others, a newcomer among them,
first fetches a healthy peer's state: torchft's live recovery), a SUM all-reduce over the participants, and the
commit vote. Every worker is its own replica group of one process.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

from torch import Tensor

#: the address a worker reads when ``lighthouse`` is not given (torchft's own variable)
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"


class ElasticError(RuntimeError):
    """Elastic training cannot go on (the lighthouse is unreachable or lost, or this worker cannot join)."""


def lighthouse_host_port(address: str) -> tuple[str, int]:
    """``(host, port)`` of a lighthouse address (``http://host:port`` or ``host:port``).

    Example::

        >>> lighthouse_host_port("http://node0:29510"), lighthouse_host_port("10.0.0.2:29510")
        (('node0', 29510), ('10.0.0.2', 29510))
        >>> lighthouse_host_port("node0")
        Traceback (most recent call last):
        ...
        ValueError: lighthouse='node0' needs a port, e.g. http://node0:29510
    """
    parsed = urlparse(address if "://" in address else f"http://{address}")
    if parsed.hostname is None or parsed.port is None:
        raise ValueError(f"lighthouse={address!r} needs a port, e.g. http://{parsed.hostname or address}:29510")
    return parsed.hostname, parsed.port


def reachable(address: str, timeout_s: float = 1.0) -> bool:
    """Whether a TCP connection to the lighthouse's port opens within ``timeout_s``."""
    host, port = lighthouse_host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_reachable(address: str, startup_timeout_s: float) -> None:
    """Wait until the lighthouse at ``address`` accepts connections.

    Raises:
        ElasticError: it did not within ``startup_timeout_s`` (the message names the address and the setting).
    """
    deadline = time.monotonic() + startup_timeout_s
    while not reachable(address, timeout_s=min(1.0, startup_timeout_s)):
        if time.monotonic() >= deadline:
            raise ElasticError(
                f"cannot reach the torchft lighthouse at {address} within startup_timeout_s={startup_timeout_s:g}: "
                f"start it (torchft_lighthouse, or start_lighthouse=True on the first worker) or fix lighthouse= / "
                f"{LIGHTHOUSE_ENV}"
            )
        time.sleep(0.1)


def start_lighthouse(address: str, min_workers: int, join_timeout_s: float, heartbeat_timeout_s: float) -> Any:
    """Start torchft's lighthouse in this process, listening on ``address``'s port; returns the server (its
    ``shutdown()`` stops it)."""
    _quiet_torchft()
    from torchft.coordination import LighthouseServer

    _, port = lighthouse_host_port(address)
    return LighthouseServer(
        bind=f"[::]:{port}",
        min_replicas=min_workers,
        join_timeout_ms=round(join_timeout_s * 1000),
        quorum_tick_ms=50,
        heartbeat_timeout_ms=round(heartbeat_timeout_s * 1000),
    )


def _quiet_torchft() -> None:
    """torchft's Rust side logs every quorum at INFO to stderr unless ``RUST_LOG`` says otherwise (read once, when
    its first server starts); its Python loggers likewise. Warnings stay."""
    os.environ.setdefault("RUST_LOG", "warn")
    for name in ("torchft", "torchft_quorums", "torchft_commits", "torchft_errors"):
        logging.getLogger(name).setLevel(logging.WARNING)


class Membership:
    """This worker in the elastic job: its torchft manager, and the round-end all-reduce.

    Args:
        lighthouse: the lighthouse's address.
        replica_id: this worker's name in the job (torchft appends a fresh id per process).
        load_state: applies a peer's state (called while this worker recovers).
        state: this worker's state for a recovering peer.
        round_timeout_s: how long a quorum and the collectives may take (longer than a round plus validation).
        lost_after_s: the lighthouse unreachable this long during a quorum ends the worker with an error naming it.
        min_workers: rounds commit only with at least this many participants.
    """

    def __init__(
        self,
        lighthouse: str,
        replica_id: str,
        load_state: Callable[[dict[str, Any]], None],
        state: Callable[[], dict[str, Any]],
        round_timeout_s: float,
        lost_after_s: float,
        min_workers: int = 1,
    ) -> None:
        _quiet_torchft()
        from torch.distributed import TCPStore
        from torchft.manager import Manager
        from torchft.process_group import ProcessGroupGloo

        self.lighthouse = lighthouse
        self.lost_after_s = lost_after_s
        self.min_workers = min_workers
        self.round_timeout_s = round_timeout_s
        timeout = timedelta(seconds=round_timeout_s)
        # The replica group's own store (one process per group). The quorum hands its address to every participant
        # (the store of torchft's cross-worker group is the primary's), so it is this machine's name, as torchft's
        # own servers advertise themselves: "localhost" would send the others to their own machines.
        host = socket.gethostname()
        self._store = TCPStore(host, 0, is_master=True, wait_for_workers=False)
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=timeout),
            load_state_dict=load_state,
            state_dict=state,
            min_replica_size=min_workers,
            use_async_quorum=False,
            timeout=timeout,
            quorum_timeout=timeout,
            connect_timeout=timedelta(seconds=10),
            rank=0,
            world_size=1,
            store_addr=host,
            store_port=self._store.port,
            lighthouse_addr=lighthouse,
            replica_id=replica_id,
        )

    def round(self, message: Callable[[int, int], Tensor]) -> tuple[Tensor | None, int, int]:
        """One round end: the quorum (recovering this worker from a peer when it is behind), then ``message(rank,
        participants)`` summed over the participants. Returns the sum (``None``: the round did not commit; a
        participant was lost on the way), this worker's rank and the number of participants.

        Raises:
            ElasticError: the quorum failed: the lighthouse is lost (named) or no quorum formed in time.
        """
        self._quorum()
        rank = self.manager.participating_rank()
        participants = self.manager.num_participants()
        assert rank is not None
        tensor = message(rank, participants)
        from torch.distributed import ReduceOp

        self.manager.allreduce(tensor, reduce_op=ReduceOp.SUM).wait()
        committed = self.manager.should_commit()
        return (tensor if committed else None), rank, participants

    def _quorum(self) -> None:
        """torchft's quorum (and this worker's recovery), watched: torchft waits for the lighthouse up to
        ``round_timeout_s``, so the lighthouse's loss is named here once it has been unreachable ``lost_after_s``."""
        done = threading.Event()
        failure: list[BaseException] = []

        def quorum() -> None:
            try:
                self.manager.start_quorum()
            except BaseException as err:  # handed to the waiting thread
                failure.append(err)
            finally:
                done.set()

        threading.Thread(target=quorum, name="elastic-quorum", daemon=True).start()
        unreachable_since: float | None = None
        while not done.wait(0.25):
            if reachable(self.lighthouse, timeout_s=0.5):
                unreachable_since = None
            elif unreachable_since is None:
                unreachable_since = time.monotonic()
            elif time.monotonic() - unreachable_since >= self.lost_after_s:
                raise ElasticError(
                    f"lost the torchft lighthouse at {self.lighthouse}: unreachable for {self.lost_after_s:g} s "
                    "while this worker waited for a quorum"
                )
        if failure:
            if isinstance(failure[0], ElasticError):
                raise failure[0]
            raise self._quorum_error(failure[0]) from failure[0]

    def _quorum_error(self, err: BaseException) -> ElasticError:
        cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if not reachable(self.lighthouse):
            return ElasticError(f"lost the torchft lighthouse at {self.lighthouse}: {cause}")
        return ElasticError(
            f"no quorum of min_workers={self.min_workers} through the torchft lighthouse at {self.lighthouse} within "
            f"{self.round_timeout_s:g} s: {cause}"
        )

    @property
    def step(self) -> int:
        """Committed rounds, torchft's step (a worker behind the others recovers from one at the highest)."""
        return self.manager.current_step()

    def fall_behind(self) -> None:
        """Count this worker one step behind the others (its history lost a round where two met): torchft recovers
        it from a peer of the history that won at the next round end."""
        self.manager.load_state_dict({"step": max(0, self.step - 1), "batches_committed": 0})

    def restore_step(self, step: int) -> None:
        """Resume torchft's step count (from a checkpoint)."""
        self.manager.load_state_dict({"step": step, "batches_committed": 0})

    def shutdown(self) -> None:
        self.manager.shutdown(wait=False)
