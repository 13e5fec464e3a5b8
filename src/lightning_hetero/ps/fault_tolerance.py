"""``AsyncPSStrategy``'s fault handling on the Lightning side: epoch-end meetings, naming the rank lost first, rank 0
answering until the others left, and elastic ASP (``on_worker_lost="continue"``).

A mixin of :class:`~lightning_hetero.ps.strategy.AsyncPSStrategy` (it reads the strategy's server, store, sampler and
launcher); the store logic it builds on is in :mod:`lightning_hetero.ps.faults`. See ``docs/async_ps.md`` (Faults).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from lightning_hetero._lightning_internals import (
    kill_launched_processes,
    launched_processes,
    rebuild_validation_loaders,
)
from lightning_hetero.ps.faults import Membership, arrived
from lightning_hetero.ps.placement import reserved_only
from lightning_hetero.ps.protocol import SERVER_RANK, PeerLostError

if TYPE_CHECKING:
    import torch.distributed as dist

    from lightning_hetero.ps.sampler import ClaimSampler
    from lightning_hetero.ps.server import ParameterServer, ServerLoop

# How long a rank whose connection broke waits for the rank that noticed first to name the rank lost first.
LOST_WORKER_GRACE_S = 5.0
# Rank 0 failing keeps serving aborts until every remote worker left, at most this long past fault_timeout_s (a
# worker blocked in a collective with rank 0 gives up after fault_timeout_s, then reads the fault from rank 0's store).
LINGER_MARGIN_S = 5.0


#: how often rank 0 looks whether the other workers are done with the epoch
_AWAIT_POLL_S = 0.01


class FaultTolerance:
    """Fault handling shared by the strategy's hooks (see the module's docstring); ``super()`` past this class must
    reach ``DDPStrategy``'s ``on_exception``."""

    # provided by AsyncPSStrategy
    fault_timeout_s: float
    on_worker_lost: str
    server_placement: str
    world_size: int
    global_rank: int
    launcher: Any
    _mode: str
    _active: bool
    _server: ParameterServer | None
    _loop: ServerLoop | None
    _shard_server: ParameterServer | None
    _shard_loop: ServerLoop | None
    _store: dist.Store | None
    _membership: Membership | None
    _needs_meeting: bool
    _claim_sampler: ClaimSampler | None
    _launched: list[Any]
    _validation_members: list[int]

    @override
    def on_exception(self, exception: BaseException) -> None:
        super().on_exception(exception)  # type: ignore[misc]
        if self._active and self._membership is not None:
            self._announce_failure(exception)
        # Lightning leaves the processes it launched running when the main one fails (except on KeyboardInterrupt);
        # a hung worker would then outlive the job. A lost one is no longer in the launcher's list (see
        # _on_rank_lost), but may be hung rather than dead.
        if launched_processes(self.launcher) is not None:
            for proc in self._launched:
                if proc.poll() is None:
                    proc.kill()
            kill_launched_processes(self.launcher)

    @property
    @override
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        members = self._membership.members if self._membership is not None else None
        if members is None or len(members) == self.world_size:
            return super().distributed_sampler_kwargs
        return {"num_replicas": len(members), "rank": members.index(self.global_rank)}

    def _lost_workers_chunks(self, epoch: int, own: set[int]) -> list[int]:
        """Rank 0's claims ran out (elastic ASP): once every other worker is done with the epoch or lost, the chunks
        of the epoch nobody pushed are the ones lost workers had claimed; rank 0 trains them."""
        server, sampler = self._server, self._claim_sampler
        assert server is not None and sampler is not None
        self._await_other_workers(epoch)
        with server.cond:
            applied = server.applied_chunks.pop(epoch, set())
        num_chunks = math.ceil(sampler.num_samples / sampler.chunk_size)
        return sorted(set(range(num_chunks)) - applied - own)

    def _await_other_workers(self, epoch: int, patience_s: float | None = None) -> None:
        """Rank 0 waits until every other worker has pushed its last batch of ``epoch``, reached the epoch's end
        meeting or was lost (or the server's update budget is spent); with ``patience_s``, at most that long after
        the first other worker reached the meeting (the meeting then names the late ones)."""
        server, membership = self._server, self._membership
        assert server is not None and membership is not None and self._store is not None
        server.finish(SERVER_RANK)  # while rank 0 waits here, the staleness bound must not wait for it
        meeting = membership.meetings
        first_arrival: float | None = None
        while True:
            with server.cond:
                if server.lost is not None:
                    raise server.lost
                if server.budget_spent:
                    return
                busy = [
                    rank
                    for rank in range(self.world_size)
                    if rank != SERVER_RANK
                    and rank not in server.lost_ranks
                    and server.finished_epoch.get(rank, -1) < epoch
                ]
            if all(arrived(self._store, meeting, rank) for rank in busy):
                return
            if patience_s is not None:
                if first_arrival is None and any(
                    arrived(self._store, meeting, r) for r in membership.members if r != SERVER_RANK
                ):
                    first_arrival = time.monotonic()
                if first_arrival is not None and time.monotonic() - first_arrival > patience_s:
                    return
            # a dedicated server rank waits here for a whole epoch: sleep rather than wake at every update's notify
            time.sleep(_AWAIT_POLL_S)

    def _meet(self) -> None:
        """Where the ranks meet at an epoch's end (before validation, at a mode switch, at the end of training, and
        before the first collective after asynchronous batches): a barrier through rank 0's store that names the
        ranks that did not arrive within ``fault_timeout_s`` and, in elastic ASP, drops the ranks lost meanwhile and
        moves later collectives to a process group of the remaining ranks."""
        assert self._membership is not None
        self._needs_meeting = False
        server = self._server

        def expected() -> list[int]:
            lost = server.lost_ranks if server is not None else set()
            return [rank for rank in self._membership.members if rank not in lost]

        def check() -> None:
            if server is not None and server.lost is not None:
                raise server.lost

        if reserved_only(self.server_placement, self._mode, self.global_rank):
            # a dedicated server rank trained its one batch at the epoch's start: wait for the workers to finish
            # theirs before the meeting, whose fault timeout starts on rank 0's arrival
            assert self._attached_trainer is not None
            self._await_other_workers(self._attached_trainer.current_epoch, patience_s=self.fault_timeout_s)
        before = len(self._membership.members)
        members = self._membership.meet(expected, check)
        if len(members) < before:
            self._check_no_rank_lost("continue in BSP", allow_asp=True)

    def _tolerates_lost_workers(self) -> bool:
        return self.on_worker_lost == "continue" and self._mode == "asp"

    def _lost_ranks(self) -> list[int]:
        members = self._membership.members if self._membership is not None else range(self.world_size)
        lost = self._server.lost_ranks if self._server is not None else set()
        return sorted(set(range(self.world_size)) - set(members) | lost)

    def _check_no_rank_lost(self, action: str, allow_asp: bool = False) -> None:
        lost = self._lost_ranks()
        if lost and not (allow_asp and self._mode == "asp"):
            raise RuntimeError(
                f"AsyncPSStrategy cannot {action} after losing rank(s) {lost}: synchronous training needs every rank. "
                "Restart the job (e.g. torchrun --max-restarts) and resume from the last checkpoint "
                "(trainer.fit(..., ckpt_path='last'))."
            )

    def _on_rank_lost(self, error: PeerLostError) -> None:
        """Called by the server's thread that saw a rank's connection break (rank 0)."""
        procs = launched_processes(self.launcher)
        if procs is not None:
            # Lightning's process observer would kill every process a few seconds after a child exits; the strategy
            # ends the job itself (after telling the others why) or goes on without it
            # (the launcher's processes are local ranks 1.. of rank 0's node, whose global ranks they are)
            proc = self._launched[error.rank - 1] if 1 <= error.rank <= len(self._launched) else None
            if proc in procs:
                procs.remove(proc)
        assert self._server is not None
        if self._server.tolerate_lost_workers and self._server.lost is None:
            remaining = self.world_size - len(self._server.lost_ranks)
            cause = re.sub(r"^\[[^\]]*\]\s*", "", error.cause).split(". ")[0]  # gloo's first sentence
            rank_zero_warn(
                f"AsyncPSStrategy lost the worker on rank {error.rank} ({cause}); continuing with {remaining} "
                "workers (on_worker_lost='continue')."
            )

    def _recorded_fault(self, wait_s: float) -> PeerLostError | None:
        """The first fault rank 0 recorded; ``None`` if none (or rank 0's store is unreachable)."""
        if self._membership is None:
            return None
        try:
            return self._membership.board.read(wait_s)
        except RuntimeError:
            return None

    def _lost_cause(self, err: BaseException) -> BaseException:
        """The error to raise for a broken connection or collective: the rank lost first, when one is known."""
        if self._server is not None:
            lost = self._server.lost or self._server.wait_lost(LOST_WORKER_GRACE_S)
            if lost is None and self._server.lost_ranks:
                rank = min(self._server.lost_ranks)
                lost = PeerLostError(rank, "worker", "its connection broke")
            return lost or err
        if self._store is None:
            return err
        try:
            recorded = self._membership.board.read(LOST_WORKER_GRACE_S) if self._membership is not None else None
        except RuntimeError as store_err:  # rank 0, which hosts the store, is gone
            return PeerLostError(SERVER_RANK, "parameter server", str(store_err).splitlines()[0])
        return recorded or err

    def _announce_failure(self, exception: BaseException) -> None:
        """Record why this rank fails on rank 0's board (the first record wins) so every other rank names the rank
        lost first; rank 0 then answers every worker's request with an abort until all left (bounded)."""
        assert self._membership is not None
        board = self._membership.board
        if isinstance(exception, PeerLostError):
            error = exception
        elif self._server is not None and self._server.lost is not None:
            error = self._server.lost
        else:
            role = "parameter server" if self.global_rank == SERVER_RANK else "worker"
            error = PeerLostError(self.global_rank, role, f"it failed with {type(exception).__name__}: {exception}")
        try:
            error = board.record(error)
            if self._server is not None:
                board.abort_meeting(self._membership.meetings - 1)
                board.abort_meeting(self._membership.meetings)
        except RuntimeError:
            return  # rank 0's store is gone; the other ranks name rank 0 themselves
        if self._server is not None and self._loop is not None:
            self._server.tolerate_lost_workers = False
            self._server.fail(error)
            self._loop.join(self.fault_timeout_s + LINGER_MARGIN_S)
        elif self._shard_server is not None and self._shard_loop is not None:  # a shard's host answers aborts too
            self._shard_server.fail(error)
            self._shard_loop.join(self.fault_timeout_s + LINGER_MARGIN_S)
        self._active = False

    def _reshard_validation(self, trainer: pl.Trainer) -> None:
        """After a rank was lost, rebuild the validation loaders so the remaining ranks share the whole set (Lightning
        keeps loaders whose ``DistributedSampler`` still deals a share to the lost rank)."""
        assert self._membership is not None
        if self._membership.members == self._validation_members:
            return
        self._validation_members = list(self._membership.members)
        rebuild_validation_loaders(trainer)

    def _collective_group(self, group: Any = None) -> Any:
        """The group a collective outside asynchronous batches runs on: the remaining ranks' after a loss. The
        epoch's first collective after its asynchronous batches is preceded by a meeting (see :meth:`_meet`)."""
        if self._needs_meeting and self._active:
            self._meet()
        if group is None and self._membership is not None:
            return self._membership.group
        return group

    def _collective(self, run: Callable[[], Any]) -> Any:
        try:
            return run()
        except RuntimeError as err:
            if isinstance(err, PeerLostError) or not self._active:
                raise
            cause = self._lost_cause(err)
            if cause is err:
                raise
            raise cause from err
