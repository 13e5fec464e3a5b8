"""``AsyncPSStrategy``'s fault handling on the Lightning side: epoch-end meetings, naming the rank lost first, rank 0
answering until the others left, and elastic ASP (``on_worker_lost="continue"``).

The store logic it builds on is in :mod:`lightning_hetero.asp.faults`. See ``docs/async_ps.md`` (Faults).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from lightning_hetero._lightning_internals import (
    kill_launched_processes,
    launched_processes,
    rebuild_validation_loaders,
)
from lightning_hetero.asp.faults import LOST_WORKER_GRACE_S, arrived
from lightning_hetero.asp.placement import reserved_only
from lightning_hetero.asp.protocol import SERVER_RANK, PeerLostError

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from lightning_hetero.async_ps.interfaces import ModeFlags
    from lightning_hetero.async_ps.runtime.context import PSContext

# Rank 0 failing keeps serving aborts until every remote worker left, at most this long past fault_timeout_s (a
# worker blocked in a collective with rank 0 gives up after fault_timeout_s, then reads the fault from rank 0's store).
LINGER_MARGIN_S = 5.0


#: how often rank 0 looks whether the other workers are done with the epoch
_AWAIT_POLL_S = 0.01


def kill_launched(launcher: Any, launched: list[Any]) -> None:
    """Lightning leaves the processes it launched running when the main one fails (except on KeyboardInterrupt); a
    hung worker would then outlive the job. A lost one is no longer in the launcher's list (see
    :meth:`FaultTolerance.on_rank_lost`), but may be hung rather than dead: ``launched`` holds every one."""
    if launched_processes(launcher) is not None:
        for proc in launched:
            if proc.poll() is None:
                proc.kill()
        kill_launched_processes(launcher)


class FaultTolerance:
    """Fault handling shared by the strategy's hooks and engines (see the module's docstring).

    Args:
        ctx: the run's shared context (its store, membership, servers and claim sampler).
        mode: the mode in force (whether it trains through the server decides what a loss allows).
        launcher: Lightning's launcher (the processes it started).
        launched: every process the launcher started, in local-rank order (1..).
    """

    def __init__(self, ctx: PSContext, mode: Callable[[], ModeFlags], launcher: Any, launched: list[Any]) -> None:
        self.ctx = ctx
        self._mode = mode
        self._launcher = launcher
        self.launched = launched
        #: the epoch's first collective after its asynchronous batches is preceded by a meeting (see :meth:`meet`)
        self.needs_meeting = False
        self._validation_members = list(range(ctx.world_size))

    @property
    def tolerates_lost_workers(self) -> bool:
        """Whether training goes on without a lost worker now (elastic ASP)."""
        return self.ctx.settings.on_worker_lost == "continue" and self._mode().through_server

    def tell_server(self) -> None:
        """Tell rank 0's server whether the mode in force tolerates a lost worker (elastic ASP is unsharded: rank 0's
        server is the only one)."""
        if self.ctx.servers.server is not None:
            self.ctx.servers.server.tolerate_lost_workers = self.tolerates_lost_workers

    def sampler_kwargs(self) -> dict[str, Any] | None:
        """A ``DistributedSampler``'s ``num_replicas`` and ``rank`` among the remaining ranks after a loss (``None``:
        none was lost)."""
        members = self.ctx.membership.members
        if len(members) == self.ctx.world_size:
            return None
        return {"num_replicas": len(members), "rank": members.index(self.ctx.rank)}

    def lost_workers_chunks(self, epoch: int, own: set[int]) -> list[int]:
        """Rank 0's claims ran out (elastic ASP): once every other worker is done with the epoch or lost, the chunks
        of the epoch nobody pushed are the ones lost workers had claimed; rank 0 trains them."""
        server, sampler = self.ctx.servers.server, self.ctx.claim_sampler
        assert server is not None and sampler is not None
        self._await_other_workers(epoch)
        with server.cond:
            applied = server.applied_chunks.pop(epoch, set())
        num_chunks = math.ceil(sampler.epoch_samples / sampler.chunk_size)
        return sorted(set(range(num_chunks)) - applied - own)

    def _await_other_workers(self, epoch: int, patience_s: float | None = None) -> None:
        """Rank 0 waits until every other worker has pushed its last batch of ``epoch``, reached the epoch's end
        meeting or was lost (or the server's update budget is spent); with ``patience_s``, at most that long after
        the first other worker reached the meeting (the meeting then names the late ones)."""
        server, membership, store = self.ctx.servers.server, self.ctx.membership, self.ctx.store
        assert server is not None
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
                    for rank in range(self.ctx.world_size)
                    if rank != SERVER_RANK
                    and rank not in server.lost_ranks
                    and server.finished_epoch.get(rank, -1) < epoch
                ]
            if all(arrived(store, meeting, rank) for rank in busy):
                return
            if patience_s is not None:
                if first_arrival is None and any(
                    arrived(store, meeting, r) for r in membership.members if r != SERVER_RANK
                ):
                    first_arrival = time.monotonic()
                if first_arrival is not None and time.monotonic() - first_arrival > patience_s:
                    return
            # a dedicated server rank waits here for a whole epoch: sleep rather than wake at every update's notify
            time.sleep(_AWAIT_POLL_S)

    def meet(self) -> None:
        """Where the ranks meet at an epoch's end (before validation, at a mode switch, at the end of training, and
        before the first collective after asynchronous batches): a barrier through rank 0's store that names the
        ranks that did not arrive within ``fault_timeout_s`` and, in elastic ASP, drops the ranks lost meanwhile and
        moves later collectives to a process group of the remaining ranks."""
        ctx = self.ctx
        self.needs_meeting = False
        server = ctx.servers.server

        def expected() -> list[int]:
            lost = server.lost_ranks if server is not None else set()
            return [rank for rank in ctx.membership.members if rank not in lost]

        def check() -> None:
            if server is not None and server.lost is not None:
                raise server.lost

        if reserved_only(ctx.settings.advanced.server_placement, self._mode().through_server, ctx.rank):
            # a dedicated server rank trained its one batch at the epoch's start: wait for the workers to finish
            # theirs before the meeting, whose fault timeout starts on rank 0's arrival
            self._await_other_workers(ctx.trainer.current_epoch, patience_s=ctx.settings.fault_timeout_s)
        before = len(ctx.membership.members)
        members = ctx.membership.meet(expected, check)
        if len(members) < before:
            self.check_no_rank_lost("continue in BSP", allow_elastic=True)

    def _lost_ranks(self) -> list[int]:
        server = self.ctx.servers.server
        lost = server.lost_ranks if server is not None else set()
        return sorted(set(range(self.ctx.world_size)) - set(self.ctx.membership.members) | lost)

    def check_no_rank_lost(self, action: str, allow_elastic: bool = False) -> None:
        """Fail naming the lost ranks, if any, unless ``allow_elastic`` and training goes through the server."""
        lost = self._lost_ranks()
        if lost and not (allow_elastic and self._mode().through_server):
            raise RuntimeError(
                f"AsyncPSStrategy cannot {action} after losing rank(s) {lost}: synchronous training needs every rank. "
                "Restart the job (e.g. torchrun --max-restarts) and resume from the last checkpoint "
                "(trainer.fit(..., ckpt_path='last'))."
            )

    def on_rank_lost(self, error: PeerLostError) -> None:
        """Called by the server's thread that saw a rank's connection break (rank 0)."""
        self._unwatch(error.rank)
        server = self.ctx.servers.server
        assert server is not None
        if server.tolerate_lost_workers and server.lost is None:
            remaining = self.ctx.world_size - len(server.lost_ranks)
            cause = re.sub(r"^\[[^\]]*\]\s*", "", error.cause).split(". ")[0]  # gloo's first sentence
            rank_zero_warn(
                f"AsyncPSStrategy lost the worker on rank {error.rank} ({cause}); continuing with {remaining} "
                "workers (on_worker_lost='continue')."
            )

    def _unwatch(self, rank: int) -> None:
        """Lightning's process observer would kill every process a few seconds after a child exits; the strategy ends
        the job itself (after telling the others why) or goes on without it. The launcher's processes are local ranks
        1.. of rank 0's node, whose global ranks they are."""
        procs = launched_processes(self._launcher)
        proc = self.launched[rank - 1] if 1 <= rank <= len(self.launched) else None
        if procs is not None and proc in procs:
            procs.remove(proc)

    def _exited_child(self, wait_s: float) -> PeerLostError | None:
        """Rank 0 with no server to notice (BSP, local SGD): the first process Lightning's launcher started that
        exited within ``wait_s``, taken out of the observer's watch so that the error naming it is raised first."""
        deadline = time.monotonic() + wait_s
        while True:
            for rank, proc in enumerate(self.launched, start=1):
                if proc.poll() is not None:
                    self._unwatch(rank)
                    return PeerLostError(rank, "worker", f"its process exited with code {proc.returncode}")
            if time.monotonic() >= deadline:
                return None
            time.sleep(_AWAIT_POLL_S)

    def recorded_fault(self, wait_s: float) -> PeerLostError | None:
        """The first fault rank 0 recorded; ``None`` if none (or rank 0's store is unreachable)."""
        try:
            return self.ctx.membership.board.read(wait_s)
        except RuntimeError:
            return None

    def lost_cause(self, err: BaseException) -> BaseException:
        """The error to raise for a broken connection or collective: the rank lost first, when one is known."""
        server = self.ctx.servers.server
        if server is not None:
            lost = server.lost or server.wait_lost(LOST_WORKER_GRACE_S)
            if lost is None and server.lost_ranks:
                rank = min(server.lost_ranks)
                lost = PeerLostError(rank, "worker", "its connection broke")
            return lost or err
        if self.ctx.rank == SERVER_RANK and self.launched:
            return self._exited_child(LOST_WORKER_GRACE_S) or err
        try:
            recorded = self.ctx.membership.board.read(LOST_WORKER_GRACE_S)
        except RuntimeError as store_err:  # rank 0, which hosts the store, is gone
            return PeerLostError(SERVER_RANK, "parameter server", str(store_err).splitlines()[0])
        return recorded or err

    def announce_failure(self, exception: BaseException) -> None:
        """Record why this rank fails on rank 0's board (the first record wins) so every other rank names the rank
        lost first; rank 0 then answers every worker's request with an abort until all left (bounded)."""
        ctx = self.ctx
        board, server = ctx.membership.board, ctx.servers.server
        if isinstance(exception, PeerLostError):
            error = exception
        elif server is not None and server.lost is not None:
            error = server.lost
        else:
            role = "parameter server" if ctx.rank == SERVER_RANK else "worker"
            error = PeerLostError(ctx.rank, role, f"it failed with {type(exception).__name__}: {exception}")
        try:
            error = board.record(error)
            if ctx.rank == SERVER_RANK:  # the store's host: ranks waiting at a meeting learn of it now
                board.abort_meeting(ctx.membership.meetings - 1)
                board.abort_meeting(ctx.membership.meetings)
        except RuntimeError:
            return  # rank 0's store is gone; the other ranks name rank 0 themselves
        hosted, loop = ctx.servers.hosted, ctx.servers.loop
        if hosted is not None and loop is not None:  # a shard's host answers aborts too
            hosted.tolerate_lost_workers = False
            hosted.fail(error)
            loop.join(ctx.settings.fault_timeout_s + LINGER_MARGIN_S)
        ctx.active = False

    def reshard_validation(self, trainer: pl.Trainer) -> None:
        """After a rank was lost, rebuild the validation loaders so the remaining ranks share the whole set (Lightning
        keeps loaders whose ``DistributedSampler`` still deals a share to the lost rank)."""
        if self.ctx.membership.members == self._validation_members:
            return
        self._validation_members = list(self.ctx.membership.members)
        rebuild_validation_loaders(trainer)

    def collective_group(self, group: Any = None) -> Any:
        """The group a collective outside asynchronous batches runs on: the remaining ranks' after a loss. The
        epoch's first collective after its asynchronous batches is preceded by a meeting (see :meth:`meet`)."""
        if self.needs_meeting and self.ctx.active:
            self.meet()
        if group is None:
            return self.ctx.membership.group
        return group

    def collective(self, run: Callable[[], Any]) -> Any:
        """Run a collective; a broken one raises the rank lost first, when one is known."""
        try:
            return run()
        except RuntimeError as err:
            if isinstance(err, PeerLostError) or not self.ctx.active:
                raise
            cause = self.lost_cause(err)
            if cause is err:
                raise
            raise cause from err
