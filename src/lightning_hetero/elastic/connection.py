"""A worker's connection to its elastic job on torchft: the lighthouse (given, or hosted by this worker), the
membership built on it at ``fit``, the join done once, and the job's position carried in checkpoints.

Both elastic strategies hold a :class:`JobConnection` and call it; what they train between quorums is theirs.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from lightning_hetero._deprecation import warn_renamed
from lightning_hetero._validation import check_range
from lightning_hetero.elastic.membership import LIGHTHOUSE_ENV, Membership, start_lighthouse, wait_reachable


class JobConnection:
    """This worker's place in an elastic job: its settings, checked when it is built, and at ``fit`` the lighthouse and
    the membership.

    Args:
        owner: the strategy's name, for messages.
        checkpoint_key: the checkpoint's key for the elastic state.
        state_name: the name of the strategy's own state in that entry (beside the membership's ``step``).
        lighthouse: torchft's lighthouse, ``http://host:port`` (default: the ``TORCHFT_LIGHTHOUSE`` variable).
        start_lighthouse: start the lighthouse in this worker at ``lighthouse``'s port.
        replica_id: this worker's name in the job (default: ``hostname-pid``).
        min_workers: a quorum commits only with at least this many workers.
        startup_timeout_s: how long a starting worker waits for the lighthouse to accept connections.
        quorum_timeout_s: how long a quorum and its collectives may wait for the others.
        join_timeout_s: after a worker was lost, how long the hosted lighthouse waits for the live workers (below
            ``quorum_timeout_s``).
        heartbeat_timeout_s: a worker silent this long is dropped (hosted lighthouse); the lighthouse unreachable this
            long during a quorum ends the worker.
        quorum_timeout_name: the strategy's name of ``quorum_timeout_s``, for messages.
        waiting: what would time out if ``join_timeout_s`` were not below ``quorum_timeout_s``, for messages.

    Raises:
        ImportError: torchft is not installed.
        ValueError: no lighthouse, or a setting out of range (the message names it).

    Example::

        >>> connection = JobConnection("MyStrategy", "my_state", "rounds", lighthouse="http://node0:29510")
        >>> connection.lighthouse, connection.describe().startswith("worker ")
        ('http://node0:29510', True)
    """

    def __init__(
        self,
        owner: str,
        checkpoint_key: str,
        state_name: str,
        lighthouse: str | None = None,
        start_lighthouse: bool = False,
        replica_id: str | None = None,
        min_workers: int = 1,
        startup_timeout_s: float = 30.0,
        quorum_timeout_s: float = 300.0,
        join_timeout_s: float = 5.0,
        heartbeat_timeout_s: float = 2.0,
        quorum_timeout_name: str = "round_timeout_s",
        waiting: str = "the round end",
    ) -> None:
        if importlib.util.find_spec("torchft") is None:
            raise ImportError(f"{owner} needs torchft: pip install 'lightning-hetero[elastic]'")
        lighthouse = lighthouse or os.environ.get(LIGHTHOUSE_ENV)
        if not lighthouse:
            raise ValueError(f"{owner} needs lighthouse='http://host:port' or {LIGHTHOUSE_ENV}")
        check_range("min_workers", min_workers, low=1, integer=True)
        for name, value in (
            ("startup_timeout_s", startup_timeout_s),
            (quorum_timeout_name, quorum_timeout_s),
            ("join_timeout_s", join_timeout_s),
            ("heartbeat_timeout_s", heartbeat_timeout_s),
        ):
            check_range(name, value, low=0, low_open=True)
        if join_timeout_s >= quorum_timeout_s:
            raise ValueError(
                f"join_timeout_s={join_timeout_s:g} must be below {quorum_timeout_name}={quorum_timeout_s:g}: "
                f"{waiting} of the workers present would time out while the lighthouse still waits for a lost one"
            )
        self.checkpoint_key = checkpoint_key
        self.state_name = state_name
        self.lighthouse = lighthouse
        self.start_lighthouse = start_lighthouse
        self.replica_id = replica_id or f"{socket.gethostname()}-{os.getpid()}"
        self.min_workers = min_workers
        self.startup_timeout_s = startup_timeout_s
        self.quorum_timeout_s = quorum_timeout_s
        self.join_timeout_s = join_timeout_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        #: built at :meth:`connect`
        self.membership: Membership | None = None
        #: whether this worker took part in its first quorum since :meth:`connect`
        self.joined = False
        self._lighthouse_server: Any = None
        self._restored: dict[str, Any] | None = None
        self._started = time.monotonic()

    def describe(self) -> str:
        """This worker and its lighthouse, in words (for the strategies' start-up line)."""
        hosted = "started here" if self.start_lighthouse else "given"
        return f"worker {self.replica_id}, lighthouse {self.lighthouse} ({hosted})"

    def host_lighthouse(self) -> Any:
        """Start torchft's lighthouse in this process at ``lighthouse``'s port, with these settings (what
        ``start_lighthouse=True`` does at :meth:`connect`); returns the server (its ``shutdown()`` stops it)."""
        return start_lighthouse(self.lighthouse, self.min_workers, self.join_timeout_s, self.heartbeat_timeout_s)

    def connect(self, load_peer_state: Callable[[dict[str, Any]], None], peer_state: Callable[[], Any]) -> Membership:
        """Host the lighthouse if asked, wait until it is reachable, and build this worker's membership, which loads
        a peer's state with ``load_peer_state`` and serves this worker's ``peer_state()`` to a recovering peer."""
        if self.start_lighthouse:
            self._lighthouse_server = self.host_lighthouse()
        wait_reachable(self.lighthouse, self.startup_timeout_s)
        self.membership = Membership(
            self.lighthouse,
            self.replica_id,
            load_peer_state,
            peer_state,
            round_timeout_s=self.quorum_timeout_s,
            lost_after_s=self.heartbeat_timeout_s,
            min_workers=self.min_workers,
        )
        return self.membership

    def join(self, restore: Callable[[Any], None], first_quorum: Callable[[], None]) -> float | None:
        """Once per ``fit``: the checkpoint's state (if one was loaded) given to ``restore`` and the membership's step
        restored, then ``first_quorum()``. Returns the seconds from this connection's construction to the end of the
        first quorum (``None``: joined already)."""
        if self.joined:
            return None
        self.joined = True
        if self._restored is not None:
            assert self.membership is not None
            restore(self._restored[self.state_name])
            self.membership.restore_step(int(self._restored["step"]))
            self._restored = None
        first_quorum()
        return time.monotonic() - self._started

    def close(self) -> None:
        """Leave the job (and stop the hosted lighthouse)."""
        self.joined = False
        if self.membership is not None:
            self.membership.shutdown()
            self.membership = None
        if self._lighthouse_server is not None:
            self._lighthouse_server.shutdown()
            self._lighthouse_server = None

    def save(self, checkpoint: dict[str, Any], state: Callable[[], Any] | None) -> None:
        """Put the job's position (the strategy's ``state()`` and the membership's step) in ``checkpoint``; nothing
        before the worker is in a job or while ``state`` is ``None``."""
        if state is not None and self.membership is not None:
            checkpoint[self.checkpoint_key] = {self.state_name: state(), "step": self.membership.step}

    def load(self, checkpoint: dict[str, Any]) -> None:
        """Keep ``checkpoint``'s job position for :meth:`join` (a plain Lightning checkpoint has none)."""
        self._restored = checkpoint.get(self.checkpoint_key)


#: what ``ElasticLocalSGDStrategy`` held as its own attributes before they moved here (its ``round_timeout_s`` is
#: ``quorum_timeout_s`` here)
MOVED = ("lighthouse", "start_lighthouse", "replica_id", "min_workers", "startup_timeout_s", "join_timeout_s")
MOVED += ("heartbeat_timeout_s", "membership", "host_lighthouse")


def moved_attribute(strategy: Any, name: str, quorum_timeout_name: str) -> Any:
    """``strategy.name`` read from its connection with a ``DeprecationWarning``, for a setting that moved there."""
    new = "quorum_timeout_s" if name == quorum_timeout_name else name
    connection = vars(strategy).get("connection")
    if connection is None or new not in (*MOVED, "quorum_timeout_s"):
        raise AttributeError(f"{type(strategy).__name__!r} object has no attribute {name!r}")
    owner = type(strategy).__name__
    warn_renamed(f"{owner}.{name}", f"{owner}.connection.{new}")
    return getattr(connection, new)
