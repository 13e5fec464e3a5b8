"""ASP (``mode="asp"``): each worker pushes its gradient to the parameter server, which applies the user's optimizer
at once and replies with the new parameters (:class:`~lightning_hetero.asp.client.AsynchronousClient`); faster
workers make more updates, and workers with fast steps claim several batches per trip to the claim counter
(:mod:`~lightning_hetero.async_ps.runtime.claim_size`). Entering ASP loads rank 0's model and optimizer state into the server
(each shard's host its cut); leaving it gives every rank the server's parameters, optimizer state, version and rank
0's schedules.

Example::

    >>> from lightning_hetero.async_ps.runtime.context import BatchWeighting
    >>> engine = AsynchronousEngine(settings=None, weighting=BatchWeighting(world_size=lambda: 2))
    >>> engine.lock_step, engine.through_server, engine.title
    (False, True, 'ASP')
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightning.pytorch.utilities import rank_zero_info

from lightning_hetero._lightning_internals import is_last_batch, optimizers_to_device, sync_module_states
from lightning_hetero.asp.protocol import FLAG_JOIN, FLAG_LAST, FLAG_SKIPPED, SERVER_RANK, STATUS_OK
from lightning_hetero.asp.server_sizing import sizing_advice
from lightning_hetero.async_ps.interfaces import SavedState
from lightning_hetero.async_ps.runtime.claim_size import ClaimSize, claim_size_message
from lightning_hetero.async_ps.runtime.clipping import ClippingStep
from lightning_hetero.async_ps.runtime.reporting import (
    compensation_message,
    report_hyperparameters,
    report_staleness,
    round_trip_message,
)
from lightning_hetero.optimizer_stand_in import OptimizerStandIn
from lightning_hetero.param_groups import hyperparameters

if TYPE_CHECKING:
    from lightning_hetero.async_ps.runtime.collectives import CollectiveGate
    from lightning_hetero.async_ps.runtime.context import BatchWeighting, PSContext
    from lightning_hetero.async_ps.runtime.fault_tolerance import FaultTolerance
    from lightning_hetero.async_ps.settings import PSSettings


class AsynchronousEngine:
    """Asynchronous training through the parameter server (see the module's docstring); an
    :class:`~lightning_hetero.async_ps.engines.Engine`.

    Args:
        settings: the strategy's settings.
        weighting: this rank's batch share (an update's gradient is weighted by it) and compute-end mark.
    """

    title = "ASP"
    lock_step = False
    through_server = True
    state_key = None

    def __init__(self, settings: PSSettings | None, weighting: BatchWeighting) -> None:
        self._weighting = weighting
        self._ctx: PSContext | None = None
        self._fault: FaultTolerance | None = None
        self._gate: CollectiveGate | None = None
        self._joined = False  # this rank pulled at the epoch's start and counts for the staleness bound
        self._chunk = -1  # the claimed chunk of the batch in hand
        self._last_staleness = 0
        self._pushed = False  # whether this step reached the server (fp16's GradScaler may skip it)
        self._compensation_announced = False
        self._sizing_advised = False
        self._met_version: int | None = None  # the server version every rank took when they last met
        self._claim_size = ClaimSize()  # batches per claim, from this rank's measured step
        self._clipping: ClippingStep | None = None

    def setup(self, ctx: PSContext, fault: FaultTolerance, gate: CollectiveGate) -> None:
        self._ctx, self._fault, self._gate = ctx, fault, gate
        self._clipping = ClippingStep(ctx, self._weighting.share)

    def _parts(self) -> tuple[PSContext, FaultTolerance, CollectiveGate]:
        assert self._ctx is not None and self._fault is not None and self._gate is not None
        return self._ctx, self._fault, self._gate

    # ------------------------------------------------------------------ entering and leaving

    def enter(self, switch: bool) -> None:
        """The first time, the servers and the client start; step-interval LR schedulers count the server's updates
        from now on; at a switch (or resuming), the server takes rank 0's model and optimizer state (each host its
        shard's); at a switch the ranks meet."""
        ctx, fault, _ = self._parts()
        started = ctx.servers.start()  # every rank enters ASP at the same point: the start of training or a switch
        self._claim_size.restart()
        if switch:
            self._joined = False
            self._met_version = None
        # rank 0's schedulers, which the server's hyper-parameters follow, count server updates, not own batches
        ctx.schedules.take_over(ctx.trainer.lr_scheduler_configs)
        if switch or (started and ctx.counter.version > 0):  # a resumed run's model and optimizer are the server's
            ctx.servers.load(ctx.flat.flat, copy.deepcopy(ctx.optimizer.state_dict()), ctx.counter.version)
        self._announce_compensation()
        if switch:
            fault.meet()

    def _announce_compensation(self) -> None:
        """Say once, on rank 0, which hyper-parameters the server uses in ASP."""
        ctx, _, _ = self._parts()
        server = ctx.servers.server
        if self._compensation_announced or server is None:
            return
        self._compensation_announced = True
        compensator = server.compensator
        mode = compensator.mode if compensator is not None else None
        overlap = ctx.servers.client is not None and ctx.servers.client.overlap
        message = compensation_message(ctx.optimizer, compensator, mode)
        rank_zero_info(message + round_trip_message(overlap) + claim_size_message())

    def leave(self) -> None:
        """Every rank takes the server's parameters, optimizer state and version, and rank 0's hyper-parameters and
        scheduler states (the server's hyper-parameters date from its last update)."""
        ctx, _, gate = self._parts()
        if ctx.claim_sampler is not None:
            ctx.claim_sampler.claim_chunks = 1
        gate.average_buffers()
        ctx.schedules.release()
        optimizer = ctx.optimizer
        schedulers = [config.scheduler for config in ctx.trainer.lr_scheduler_configs]
        payload_obj = None
        if ctx.servers.server is not None:
            state = ctx.servers.server_state()
            ctx.flat.flat.copy_(state["params"])
            current = [hyperparameters(group) for group in optimizer.param_groups]
            payload_obj = (state["optimizer"], state["version"], current, [s.state_dict() for s in schedulers])
        optimizer_state, version, current, scheduler_states = gate.broadcast(payload_obj, SERVER_RANK)
        optimizer.load_state_dict(copy.deepcopy(optimizer_state))
        for group, hyper in zip(optimizer.param_groups, current, strict=True):
            group.update(hyper)
        if ctx.rank != SERVER_RANK:  # schedulers counted server updates on rank 0 only
            for scheduler, scheduler_state in zip(schedulers, scheduler_states, strict=True):
                scheduler.load_state_dict(scheduler_state)
        optimizers_to_device([optimizer], ctx.root_device)
        sync_module_states(ctx.module)
        ctx.counter.set(version, in_step=False)

    # ------------------------------------------------------------------ stepping

    def batch_start(self) -> None:
        ctx, fault, _ = self._parts()
        if not self._joined:
            # the epoch's first batch: start on the latest parameters and count for the staleness bound from now on
            self._pull(FLAG_JOIN)
            self._joined = True
        sampler = ctx.claim_sampler
        self._chunk = -1
        if sampler is not None:
            self._chunk = sampler.next_chunk()
            sampler.claim_chunks = self._claim_size.batch_started(time.perf_counter())
        # the epoch's first collective after its asynchronous batches is preceded by a meeting of the ranks
        fault.needs_meeting = True

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any, **kwargs: Any) -> Any:
        """Lightning's loop steps a stand-in for the user's optimizer whose step is a round trip to the server;
        ``gradient_clip_val`` limits the global batch's gradient norm (:mod:`~lightning_hetero.async_ps.runtime.clipping`)."""
        ctx, _, _ = self._parts()
        remote = OptimizerStandIn(optimizer, self._update)
        self._pushed = False
        assert self._clipping is not None
        if self._clipping.active:
            closure = self._clipping.closure(closure)
        output = ctx.precision_plugin.optimizer_step(remote, model=model, closure=closure, **kwargs)
        if not self._pushed:  # fp16's GradScaler skipped the step (inf/NaN): the server skips it too
            self._update(None, skipped=True)
        return output

    def _update(self, closure: Callable[[], Any] | None, skipped: bool = False) -> Any:
        ctx, _, _ = self._parts()
        result = None if closure is None else closure()
        assert self._clipping is not None
        self._clipping.restore()
        self._weighting.mark_compute_end()
        client = ctx.servers.client
        assert client is not None
        flags = (FLAG_LAST if is_last_batch(ctx.trainer) else 0) | (FLAG_SKIPPED if skipped else 0)
        self._joined = not flags & FLAG_LAST
        self._pushed = True
        header = client.push(
            ctx.flat.params, flags, ctx.counter.version, self._weighting.share(), ctx.trainer.current_epoch, self._chunk
        )
        self._last_staleness = header.staleness if header.status == STATUS_OK else 0
        ctx.counter.set(header.version, in_step=True)
        return result

    def _pull(self, flags: int = 0) -> None:
        ctx, _, _ = self._parts()
        assert ctx.servers.client is not None
        ctx.counter.set(ctx.servers.client.pull(ctx.counter.version, flags).version, in_step=False)

    def report_step(self) -> None:
        """Every rank reports its update's staleness; rank 0 the momentum and learning rate the server uses."""
        ctx, _, _ = self._parts()
        epoch = ctx.trainer.current_epoch
        report_staleness(ctx.log, ctx.module, self._last_staleness, epoch)
        if ctx.rank == SERVER_RANK:
            server = ctx.servers.server
            compensator = server.compensator if server is not None else None
            report_hyperparameters(ctx.log, ctx.module, ctx.optimizer.param_groups[0], compensator, epoch)

    def epoch_end(self) -> None:
        """Every rank's pushes applied (at a validation point inside an epoch one may still be in flight), the ranks
        meet, take the server's latest parameters (the same version on every rank; none when the server has no update
        since they last met) and average their buffers; after the first epoch rank 0 says what the server-sizing rule
        recommends from the server's measured cost and load. Before ASP first starts (Lightning's sanity check) the
        ranks hold the model they synchronised at setup: nothing to do."""
        ctx, fault, gate = self._parts()
        if ctx.servers.client is None:
            return
        server = ctx.servers.server
        if not self._sizing_advised and server is not None and server.tracker.updates:
            self._sizing_advised = True
            shards = 1 if ctx.servers.shards is None else len(ctx.servers.shards)
            rank_zero_info(sizing_advice(server.statistics(), shards).message)
        ctx.servers.client.settle()
        self._claim_size.restart()
        fault.meet()
        kept = ctx.flat.flat.clone() if self._met_version is not None else None
        self._pull()
        if kept is not None and ctx.counter.version == self._met_version:
            # no update since the ranks last met: the model keeps what a callback put in since (SWA's average at
            # the fit's end); the same decision on every rank, from the version they all pulled
            ctx.flat.flat.copy_(kept)
        self._met_version = ctx.counter.version
        gate.average_buffers()

    # ------------------------------------------------------------------ checkpoints

    def saved_state(self) -> SavedState | None:
        """Rank 0: the server's parameters, optimizer state and version."""
        ctx, _, _ = self._parts()
        if ctx.servers.server is None:
            return None
        state = ctx.servers.server_state()
        return SavedState(state["params"], state["optimizer"], state["version"])

    def state_dict(self) -> dict[str, Any] | None:
        return None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """ASP keeps no state of its own (the server's is the model's and the optimizer's)."""
