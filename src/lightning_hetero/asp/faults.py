"""Faults: who was lost first, and epoch-end meetings that survive a lost rank.

Both live in a key-value store hosted by rank 0 (the parameter server's rank), which outlives any other rank:

- :class:`FaultBoard` keeps the *first* lost rank (first writer wins), so a rank whose own connection broke only
  because another rank failed can name the rank that failed first.
- :func:`coordinate_meeting` (rank 0) and :func:`attend_meeting` (the others) are an epoch-end barrier over the
  store: rank 0 waits for the ranks it still counts as members, names the ones that do not arrive within the fault
  timeout, and announces the members; a rank lost on the way is dropped when the job continues without it.

No Lightning here; only :class:`Membership` builds a process group. Any ``torch.distributed.Store`` works (a
``HashStore`` in tests).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import timedelta

import torch.distributed as dist

from lightning_hetero.asp.protocol import SERVER_RANK, PeerLostError

# How long a rank whose connection broke waits for the rank that noticed first to name the rank lost first.
LOST_WORKER_GRACE_S = 5.0
_FAULT_KEY = "faults/first"
_ABORT = "abort"
_POLL_S = 0.005


def encode_fault(error: PeerLostError) -> str:
    """``"rank|role|cause"``; the inverse of :func:`decode_fault`.

    Example::

        >>> text = encode_fault(PeerLostError(2, "worker", "Connection closed by peer"))
        >>> text
        '2|worker|Connection closed by peer'
        >>> str(decode_fault(text))
        'AsyncPSStrategy lost the worker on rank 2: Connection closed by peer'
    """
    return f"{error.rank}|{error.role}|{error.cause}"


def decode_fault(text: str | bytes) -> PeerLostError:
    if isinstance(text, bytes):
        text = text.decode()
    rank, role, cause = text.split("|", 2)
    return PeerLostError(int(rank), role, cause)


class FaultBoard:
    """The job's first fault, shared through a store.

    Args:
        store: a store every rank reaches (rank 0 hosts it).

    Example::

        >>> import torch.distributed as dist
        >>> board = FaultBoard(dist.HashStore())
        >>> board.read() is None
        True
        >>> first = board.record(PeerLostError(1, "worker", "Connection closed by peer"))
        >>> later = board.record(PeerLostError(0, "parameter server", "Connection reset"))
        >>> later.rank, board.read().rank  # the first record stays
        (1, 1)
    """

    def __init__(self, store: dist.Store) -> None:
        self.store = store

    def record(self, error: PeerLostError) -> PeerLostError:
        """Record ``error`` unless a fault is already recorded; return the recorded (first) one."""
        return decode_fault(self.store.compare_set(_FAULT_KEY, "", encode_fault(error)))

    def read(self, wait_s: float = 0.0) -> PeerLostError | None:
        """The recorded fault, waiting up to ``wait_s`` for one; ``None`` if there is none.

        Raises:
            RuntimeError: the store is unreachable (its host, rank 0, is gone).
        """
        if not self.store.check([_FAULT_KEY]):  # raises at once when the store is gone
            if wait_s <= 0:
                return None
            try:
                self.store.wait([_FAULT_KEY], timedelta(seconds=wait_s))
            except dist.DistStoreError as err:
                if "timeout" not in str(err):
                    raise
                return None
        return decode_fault(self.store.get(_FAULT_KEY))

    def abort_meeting(self, meeting: int) -> None:
        """Release the ranks waiting in ``meeting`` (not yet announced) with the recorded fault."""
        self.store.compare_set(_members_key(meeting), "", _ABORT)


def _arrived_key(meeting: int, rank: int) -> str:
    return f"meetings/{meeting}/arrived/{rank}"


def _members_key(meeting: int) -> str:
    return f"meetings/{meeting}/members"


def arrived(store: dist.Store, meeting: int, rank: int) -> bool:
    return store.check([_arrived_key(meeting, rank)])


def coordinate_meeting(
    board: FaultBoard,
    meeting: int,
    expected: Callable[[], Iterable[int]],
    timeout_s: float,
    check: Callable[[], None] = lambda: None,
) -> list[int]:
    """Rank 0's side of an epoch-end meeting: wait for every rank in ``expected()`` (re-read while waiting, so a rank
    lost meanwhile can be dropped), then announce and return the members.

    Args:
        board: the fault board on rank 0's store.
        meeting: the meeting's number (the same on every rank).
        expected: the ranks that must arrive, rank 0 included.
        timeout_s: how long to wait for the last one.
        check: called while waiting; raises to abandon the meeting (e.g. a lost rank the job does not survive).

    Raises:
        PeerLostError: a rank did not arrive within ``timeout_s`` (recorded on the board; the others are released).

    Example::

        >>> import torch.distributed as dist
        >>> board = FaultBoard(dist.HashStore())
        >>> board.store.set(_arrived_key(0, 2), "1")
        >>> coordinate_meeting(board, 0, expected=lambda: [0, 2], timeout_s=1.0)
        [0, 2]
        >>> coordinate_meeting(board, 1, expected=lambda: [0, 1], timeout_s=0.05)
        Traceback (most recent call last):
        ...
        lightning_hetero.asp.protocol.PeerLostError: AsyncPSStrategy lost the worker on rank 1: it did not reach the epoch's end within fault_timeout_s=0.05
    """
    store = board.store
    store.set(_arrived_key(meeting, SERVER_RANK), "1")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            check()
        except BaseException:
            board.abort_meeting(meeting)
            raise
        members = sorted(expected())
        if store.check([_arrived_key(meeting, rank) for rank in members]):  # one round trip for all
            store.set(_members_key(meeting), ",".join(map(str, members)))
            return members
        if time.monotonic() < deadline:
            time.sleep(_POLL_S)
            continue
        missing = [rank for rank in members if not store.check([_arrived_key(meeting, rank)])]
        if missing:
            late = "it" if len(missing) == 1 else f"ranks {missing}"
            cause = f"{late} did not reach the epoch's end within fault_timeout_s={timeout_s:g}"
            error = board.record(PeerLostError(missing[0], "worker", cause))
            board.abort_meeting(meeting)
            raise error
        time.sleep(_POLL_S)


def attend_meeting(board: FaultBoard, meeting: int, rank: int, timeout_s: float) -> list[int]:
    """A non-server rank's side of an epoch-end meeting: arrive, wait for rank 0's announcement, return the members.

    Rank 0 must arrive within ``2 * timeout_s`` (in elastic ASP it may first wait for a slow worker's last step,
    then train a lost worker's batches) and then announces within its own ``timeout_s``.

    Args:
        board: the fault board on rank 0's store.
        meeting: the meeting's number.
        rank: this rank.
        timeout_s: the fault timeout.

    Raises:
        PeerLostError: the recorded fault when rank 0 aborted the meeting; rank 0 itself when it did not arrive, did
            not announce, or its store became unreachable.

    Example::

        >>> import torch.distributed as dist
        >>> board = FaultBoard(dist.HashStore())
        >>> board.store.set(_arrived_key(0, 0), "1"); board.store.set(_members_key(0), "0,1")
        >>> attend_meeting(board, 0, rank=1, timeout_s=1.0)
        [0, 1]
        >>> board.record(PeerLostError(2, "worker", "Connection closed by peer")).rank
        2
        >>> board.abort_meeting(1)
        >>> attend_meeting(board, 1, rank=1, timeout_s=1.0)
        Traceback (most recent call last):
        ...
        lightning_hetero.asp.protocol.PeerLostError: AsyncPSStrategy lost the worker on rank 2: Connection closed by peer
    """
    store = board.store
    try:
        store.set(_arrived_key(meeting, rank), "1")
        for key, what, wait_s in (
            (_arrived_key(meeting, SERVER_RANK), "reach", 2 * timeout_s),
            (_members_key(meeting), "close", timeout_s + 5.0),
        ):
            try:
                store.wait([key], timedelta(seconds=wait_s))
            except dist.DistStoreError as err:
                if "timeout" not in str(err):
                    raise
                recorded = board.read()
                raise recorded or PeerLostError(
                    SERVER_RANK,
                    "parameter server",
                    f"it did not {what} the epoch's end meeting within {wait_s:g} s (fault_timeout_s={timeout_s:g})",
                ) from None
        members = store.get(_members_key(meeting)).decode()
    except dist.DistError as err:
        raise PeerLostError(SERVER_RANK, "parameter server", str(err).splitlines()[0]) from err
    if members == _ABORT:
        recorded = board.read()
        raise recorded or PeerLostError(SERVER_RANK, "parameter server", "it abandoned the epoch's end meeting")
    return [int(member) for member in members.split(",")]


class Membership:
    """The ranks that still take part in the job, agreed at epoch-end meetings, and a process group of them.

    After a meeting that dropped a lost rank, collectives must run on :attr:`group` (the default group still
    contains the lost rank, and a collective on it fails).

    Args:
        board: the fault board on rank 0's store.
        rank: this process's global rank.
        world_size: the number of ranks the job started with.
        timeout_s: the fault timeout (meetings, and the new group's collectives).
    """

    def __init__(self, board: FaultBoard, rank: int, world_size: int, timeout_s: float) -> None:
        self.board = board
        self.rank = rank
        self.timeout_s = timeout_s
        self.members = list(range(world_size))
        #: the members' process group; ``None`` while it is the default group
        self.group: dist.ProcessGroup | None = None
        #: meetings held so far (the next meeting's number)
        self.meetings = 0

    def meet(self, expected: Callable[[], Iterable[int]], check: Callable[[], None] = lambda: None) -> list[int]:
        """Hold the next meeting (rank 0 waits for ``expected()``, see :func:`coordinate_meeting`) and, when the
        members changed, build their process group. Returns the members."""
        meeting = self.meetings
        self.meetings += 1
        if self.rank == SERVER_RANK:
            members = coordinate_meeting(self.board, meeting, expected, self.timeout_s, check)
        else:
            members = attend_meeting(self.board, meeting, self.rank, self.timeout_s)
        if members != self.members:
            self.members = members
            self.group = dist.new_group(
                members, timeout=timedelta(seconds=self.timeout_s), use_local_synchronization=True
            )
        return members
