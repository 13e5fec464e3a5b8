"""``AsyncPSStrategy``: asynchronous parameter-server training (ASP) and synchronous all-reduce (BSP) in one
Lightning strategy, switchable between epochs.

Topology: launched like DDP (``devices=N`` processes, or several nodes through Lightning's cluster environments);
all N processes are workers and the parameter server (PS) runs as threads inside global rank 0, one receiving
thread per remote worker (with ``server_shards=k``, shard s in rank s). See ``docs/async_ps.md`` for how steps,
epochs, logging, checkpoints and faults work.

This module is the strategy's lifecycle and its Lightning hooks; each job lives in a module of its own:
:mod:`~lightning_hetero.ps.bootstrap` (starting the server), :mod:`~lightning_hetero.ps.claiming` (the training
loader's claim sampler), :mod:`~lightning_hetero.ps.asp_client` (a worker's round trips in ASP),
:mod:`~lightning_hetero.ps.mode_switching` (BSP steps and mode switches), :mod:`~lightning_hetero.ps.collectives`
(collectives inside asynchronous batches), :mod:`~lightning_hetero.ps.checkpointing`,
:mod:`~lightning_hetero.ps.shard_hosting` (the server's shards),
:mod:`~lightning_hetero.ps.fault_tolerance` and :mod:`~lightning_hetero.ps.reporting` (what it logs).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_hetero._lightning_internals import is_last_batch, set_global_step
from lightning_hetero._validation import check_finite
from lightning_hetero.batch_weighting import equal_share
from lightning_hetero.contracts import ComputeEndMark, Mode, check_mode
from lightning_hetero.lr_schedules import CountedLRSchedulers
from lightning_hetero.param_groups import hyperparameters
from lightning_hetero.ps.asp_client import AsynchronousClient, RemoteStepOptimizer
from lightning_hetero.ps.bootstrap import FlatModel, ServerBootstrap
from lightning_hetero.ps.checkpointing import Checkpointing
from lightning_hetero.ps.claiming import DataClaiming
from lightning_hetero.ps.collectives import CollectiveGating
from lightning_hetero.ps.compensation import AsynchronyCompensator, check_compensation_mode
from lightning_hetero.ps.fault_tolerance import FaultTolerance
from lightning_hetero.ps.faults import Membership
from lightning_hetero.ps.local_mode import LocalSGDMode
from lightning_hetero.ps.mode_switching import ModeSwitching
from lightning_hetero.ps.placement import check_server_placement, refuse_hetero_batches, training_workers
from lightning_hetero.ps.protocol import FLAG_JOIN, FLAG_LAST, SERVER_RANK, STATUS_OK
from lightning_hetero.ps.reporting import EpochLog, compensation_message, report_hyperparameters, report_staleness
from lightning_hetero.ps.sampler import ClaimSampler
from lightning_hetero.ps.server import ParameterServer, ServerLoop
from lightning_hetero.ps.shard_hosting import ShardHosting
from lightning_hetero.ps.sharding import Shard, check_server_shards
from lightning_hetero.ps.staleness import staleness_lr_factor

if TYPE_CHECKING:
    from lightning_hetero._lightning_internals import StrategyRegistryType

ON_WORKER_LOST = ("fail", "continue")


class AsyncPSStrategy(
    ServerBootstrap,
    FaultTolerance,
    ModeSwitching,
    LocalSGDMode,
    DataClaiming,
    CollectiveGating,
    Checkpointing,
    ShardHosting,
    DDPStrategy,
):
    """Asynchronous parameter-server training (``mode="asp"``), synchronous all-reduce (``mode="bsp"``) or local SGD
    with an outer optimizer (``mode="local"``).

    In ASP each worker computes gradients on its own batch and pushes them (one flat buffer) to the parameter server,
    which applies the user's optimizer at once, bumps its version and replies with the new parameters (one flat
    buffer); faster workers make more updates. In BSP every rank all-reduces its share-weighted gradients and steps
    its own copy of the optimizer, as DDP does. In local SGD every rank trains its own copy for a round, then the
    ranks all-reduce their sample-weighted pseudo-gradients once and an outer optimizer applies them (DiLoCo; see
    ``docs/local_sgd.md``). :meth:`set_mode` switches between the three at an epoch's end.

    Args:
        mode: ``"asp"``, ``"bsp"`` or ``"local"``; can be changed later with :meth:`set_mode`.
        max_staleness: stale-synchronous bound: a worker more than this many of its own updates ahead of the slowest
            active worker waits (``None``: no bound, pure ASP).
        lr_scaling: ``"none"``, or ``"inverse"`` to divide the learning rate of each update by its staleness.
        asynchrony_compensation: ``"auto"`` (default): in ASP the server's optimizer runs with momentum lowered (and,
            past what momentum can absorb, the learning rate damped) by the measured staleness, so that explicit
            plus asynchrony's implicit momentum equal the user's and each sample moves the model as far as in BSP
            (see :mod:`~lightning_hetero.ps.compensation`); ``"dc"``: the same plus delay-compensated gradients
            (Zheng et al., 2017); ``None``: the user's hyper-parameters as they are. BSP always uses the user's.
        fault_timeout_s: how long any rank waits for a peer before failing with an error naming it (also the
            default process group's timeout once started). A rank that dies is detected at once.
        startup_timeout_s: how long the ranks wait for each other at start-up (the process group's rendezvous).
        on_worker_lost: ``"fail"`` ends the job when any rank is lost; ``"continue"`` (elastic ASP) lets the other
            workers train on without a lost non-server rank while in ASP (its unfinished batches go to rank 0 at the
            epoch's end, so every epoch still covers every sample once). Losing rank 0, or any rank in BSP, ends
            the job either way (and so does any loss in local SGD; ``mode="local"`` with ``"continue"`` is refused).
        round_samples: local SGD: a round lasts this many training samples over all ranks.
        round_s: local SGD: or this many seconds (give at most one; neither: 16 local steps per rank on average).
        local_steps: local SGD: ``"proportional"`` (each rank's local steps follow its measured throughput) or
            ``"equal"`` (DiLoCo).
        outer_optimizer: local SGD: the outer optimizer's class (default ``torch.optim.SGD``).
        outer_optimizer_kwargs: its arguments (default DiLoCo's ``lr=0.7, momentum=0.9, nesterov=True``). The local
            SGD settings are validated at construction whatever the starting mode.
        pseudo_gradient_weighting: local SGD: ``"mean"`` (default) combines the ranks' pseudo-gradients as a plain
            mean over the ranks that trained in the round; ``"samples"`` weights each by the samples it trained
            (with speed-proportional steps the fast ranks then dominate; see ``docs/local_sgd.md``).
        overlap_round_trip: ``False`` (default): textbook ASP, each worker waits for the server's reply to its
            gradient before its next batch. ``True``: the push and the reply travel while the next batch is fetched
            and computed, so the round trip leaves the critical path; each gradient is then computed on parameters
            that hold all of the worker's own updates but the previous one (a bounded extra staleness of one own
            update). The last batch of an epoch, validation and mode switches wait for the update in flight.
        server_shards: split the parameter server into this many shards, each a contiguous run of whole parameter
            tensors of about equal size, hosted by ranks ``0 .. server_shards - 1`` (threads, as rank 0's server is
            with 1); every push and pull goes to every shard with its slice, so each shard's CPU applies
            ``1/server_shards`` of every update. Checkpoints hold the unsharded state (a checkpoint resumes with any
            number of shards); ``max_staleness`` holds at each shard; losing a shard's host ends the job naming it.
            At most the world size; not with ``on_worker_lost="continue"``. See ``docs/async_ps.md`` (Sharding).
        server_placement: ``"worker"`` (default): the server runs as threads in rank 0, which trains like the others.
            ``"dedicated"``: rank 0 is reserved for the server: in ASP it trains only its reserved first batch of each
            epoch and ranks 1..N-1 the rest (see :mod:`~lightning_hetero.ps.placement`); not with ``server_shards``
            > 1, ``on_worker_lost="continue"`` or ``HeteroBatchCallback``. See ``docs/async_ps.md`` (Server placement).
        accelerator: see :class:`~lightning.pytorch.strategies.DDPStrategy`.
        parallel_devices: see :class:`~lightning.pytorch.strategies.DDPStrategy`.
        cluster_environment: see :class:`~lightning.pytorch.strategies.DDPStrategy`.
        checkpoint_io: see :class:`~lightning.pytorch.strategies.DDPStrategy`.
        precision_plugin: see :class:`~lightning.pytorch.strategies.DDPStrategy`.
        process_group_backend: backend of the default group (used in BSP); the server always talks gloo.

    Notes:
        Supports automatic optimization with exactly one optimizer. In ASP, ``trainer.global_step`` is the server's
        version (updates from all workers) and ``max_steps`` bounds it; validation runs at epoch ends only.

    Example::

        >>> strategy = AsyncPSStrategy(mode="bsp", max_staleness=4)
        >>> strategy.mode, strategy.max_staleness, strategy.last_switch_s
        ('bsp', 4, None)
    """

    strategy_name = "async_ps"

    def __init__(
        self,
        mode: Mode = "asp",
        max_staleness: int | None = None,
        lr_scaling: str = "none",
        asynchrony_compensation: str | None = "auto",
        fault_timeout_s: float = 60.0,
        startup_timeout_s: float = 300.0,
        on_worker_lost: str = "fail",
        round_samples: int | None = None,
        round_s: float | None = None,
        local_steps: str = "proportional",
        outer_optimizer: Callable[..., torch.optim.Optimizer] | None = None,
        outer_optimizer_kwargs: dict[str, Any] | None = None,
        pseudo_gradient_weighting: str = "mean",
        overlap_round_trip: bool = False,
        server_shards: int = 1,
        server_placement: str = "worker",
        accelerator: pl.accelerators.Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: Any = None,
        checkpoint_io: Any = None,
        precision_plugin: Any = None,
        process_group_backend: str | None = None,
    ) -> None:
        check_mode(mode)
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 or None, got {max_staleness}")
        staleness_lr_factor(0, lr_scaling)
        check_finite(fault_timeout_s=fault_timeout_s, startup_timeout_s=startup_timeout_s)
        check_compensation_mode(asynchrony_compensation)
        if not fault_timeout_s > 0:
            raise ValueError(f"fault_timeout_s must be positive, got {fault_timeout_s}")
        if not startup_timeout_s > 0:
            raise ValueError(f"startup_timeout_s must be positive, got {startup_timeout_s}")
        if on_worker_lost not in ON_WORKER_LOST:
            raise ValueError(f"on_worker_lost must be one of {ON_WORKER_LOST}, got {on_worker_lost!r}")
        if mode == "local" and on_worker_lost == "continue":
            raise ValueError(
                "AsyncPSStrategy(mode='local') cannot honour on_worker_lost='continue': every round ends in an "
                "all-reduce over all ranks, so losing one ends the job. Use on_worker_lost='fail' and resume from the "
                "last checkpoint, or start in mode='asp' (on_worker_lost='continue' applies to ASP phases only)."
            )
        self._init_local(
            round_samples, round_s, local_steps, outer_optimizer, outer_optimizer_kwargs, pseudo_gradient_weighting
        )
        if not isinstance(overlap_round_trip, bool):
            raise ValueError(f"overlap_round_trip must be True or False, got {overlap_round_trip!r}")
        check_server_shards(server_shards, on_worker_lost=on_worker_lost)
        check_server_placement(server_placement, server_shards, on_worker_lost)
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=timedelta(seconds=startup_timeout_s),
        )
        self._mode: Mode = mode
        self.max_staleness = max_staleness
        self.lr_scaling = lr_scaling
        self._compensation_mode = asynchrony_compensation
        self._compensation_announced = False
        self.fault_timeout_s = fault_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.on_worker_lost = on_worker_lost
        self.overlap_round_trip = overlap_round_trip
        self.server_shards = server_shards
        self.server_placement = server_placement
        #: seconds the last effective :meth:`set_mode` took (``None`` before any switch)
        self.last_switch_s: float | None = None
        #: updates applied to the model so far (the server's version in ASP, the step count in BSP)
        self.version = 0
        #: the server's statistics (rank 0, after fitting): updates, per-worker updates, staleness mean and max,
        #: ``"server"`` (the cost of shard 0, or of the only server) and with shards ``"shards"`` (each one's cost)
        self.server_summary: dict[str, Any] | None = None
        self._compute_timer: ComputeEndMark | None = None
        self._batch_share: Callable[[], float] | None = None
        self._last_staleness = 0
        self._epoch_log = EpochLog(gather=lambda tensor: self.all_gather(tensor.to(self.root_device)))
        self._snapshot: dict[str, Any] | None = None
        self._restored: dict[str, Any] | None = None
        self._active = False
        self._joined = False
        self._attached_trainer: pl.Trainer | None = None
        self._flat_model: FlatModel | None = None
        self._client: AsynchronousClient | None = None
        self._server: ParameterServer | None = None
        self._loop: ServerLoop | None = None
        self._shard_server: ParameterServer | None = None
        self._shard_loop: ServerLoop | None = None
        self._shards: list[Shard] | None = None
        self._group_indices: list[list[int]] = []
        self._step_schedules = CountedLRSchedulers()
        self._store: dist.Store | None = None
        self._membership: Membership | None = None
        self._needs_meeting = False
        self._claim_sampler: ClaimSampler | None = None
        self._chunk = -1
        self._launched: list[Any] = []
        self._validation_members: list[int] = []

    # ------------------------------------------------------------------ public API

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def in_lock_step(self) -> bool:
        """Whether the ranks train in lock-step now (in BSP); in ASP each rank runs its own number of batches."""
        return self._mode == "bsp"

    @property
    @override
    def is_distributed(self) -> bool:
        return True

    @property
    def asynchrony_compensation(self) -> str | None:
        """The asynchrony compensation mode (settable; takes effect at the server's next update)."""
        return self._compensation_mode

    @asynchrony_compensation.setter
    def asynchrony_compensation(self, mode: str | None) -> None:
        check_compensation_mode(mode)
        self._compensation_mode = mode
        server = self._hosted_server
        if server is not None:
            with server.cond:
                server.compensator = self._new_compensator()

    def _new_compensator(self) -> AsynchronyCompensator | None:
        if self._compensation_mode is None:
            return None
        workers = training_workers(self.world_size, self.server_placement)
        compensator = AsynchronyCompensator(self._compensation_mode, workers=workers)
        compensator.apply([hyperparameters(group) for group in self.optimizers[0].param_groups])
        return compensator

    def attach_hetero_batches(self, compute_timer: ComputeEndMark, batch_share: Callable[[], float]) -> None:
        """Connect per-rank batch sizes (called once at setup by ``HeteroBatchCallback``).

        The strategy calls ``compute_timer.mark_compute_end()`` as soon as local gradients are ready, before any
        communication, and weights gradients by :func:`~lightning_hetero.batch_weighting.gradient_weight` of
        ``batch_share()``: in BSP by the share itself before a SUM all-reduce (a batch-weighted mean); in ASP an
        update's gradient by ``batch_share() * world_size`` (1 for equal shares), so a worker's update weighs as
        much as its data would in the synchronous mean.

        Args:
            compute_timer: a :class:`~lightning_hetero.measurement.ComputeTimer` (anything with
                ``mark_compute_end()``).
            batch_share: returns this rank's ``b_k / sum(b)`` for the current step.
        """
        refuse_hetero_batches(self.server_placement, self.on_worker_lost)
        self._compute_timer = compute_timer
        self._batch_share = batch_share

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: StrategyRegistryType) -> None:
        if cls.strategy_name not in strategy_registry:
            strategy_registry.register(
                cls.strategy_name, cls, description="Asynchronous parameter-server training (lightning-hetero)"
            )

    # ------------------------------------------------------------------ lifecycle (setup: ServerBootstrap)

    @override
    def on_train_start(self) -> None:
        self._epoch_log.restart()
        if self._restored is not None:
            self._set_step_counter(self.version, in_step=False)
        if self._mode == "local":
            self._enter_local()
        if self._mode == "asp":
            self._take_over_step_schedules()
            self._announce_compensation()

    def _announce_compensation(self) -> None:
        """Say once, on rank 0, which hyper-parameters the server uses in ASP."""
        if self._compensation_announced or self._server is None:
            return
        self._compensation_announced = True
        user = self.optimizers[0].param_groups[0]
        rank_zero_info(compensation_message(user, self._server.compensator, self._compensation_mode))

    def _take_over_step_schedules(self) -> None:
        """In ASP, step-interval LR schedulers count the server's updates (rank 0's schedulers, which the server's
        hyper-parameters follow), not each rank's own batches."""
        assert self._attached_trainer is not None
        self._step_schedules.take_over(self._attached_trainer.lr_scheduler_configs)

    @override
    def on_train_end(self) -> None:
        if not self._active:
            return
        if self._mode == "asp":
            self._meet()
            self._pull()
            self._average_buffers()
        self._step_schedules.release()
        if self._server is not None:
            self.server_summary = self._server_summary()
        self._leave_servers()
        self._active = False

    # ------------------------------------------------------------------ stepping

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        if self._mode == "local" and self._active:
            self._local_batch_start()
        asynchronous = self._mode == "asp" and self._active
        if asynchronous:
            if not self._joined:
                # the epoch's first batch: start on the latest parameters and count for the staleness bound from now on
                self._pull(FLAG_JOIN)
                self._joined = True
            self._chunk = self._claim_sampler.next_chunk() if self._claim_sampler is not None else -1
            # the epoch's first collective after its asynchronous batches is preceded by a meeting of the ranks
            self._needs_meeting = True
        output = super().training_step(*args, **kwargs)
        if self._active:
            self._report_step(asynchronous)
        return output

    def _report_step(self, asynchronous: bool) -> None:
        """Report an asynchronous update's staleness (every rank), and on rank 0 the momentum and learning rate that
        updates use: the server's compensated values in ASP, the optimizer's own otherwise (epoch statistics, see
        :class:`~lightning_hetero.ps.reporting.EpochLog`)."""
        trainer = self._attached_trainer
        assert trainer is not None
        epoch = trainer.current_epoch
        if asynchronous:
            report_staleness(self._epoch_log, self.lightning_module, self._last_staleness, epoch)
        if self.global_rank == SERVER_RANK:
            compensator = self._server.compensator if self._server is not None and self._mode == "asp" else None
            group = self.optimizers[0].param_groups[0]
            report_hyperparameters(self._epoch_log, self.lightning_module, group, compensator, epoch)

    @override
    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        model = model or self.lightning_module
        if not self._active:
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        if self._mode == "bsp":
            return self._synchronous_step(optimizer, closure, model, **kwargs)
        if self._mode == "local":
            return self._local_optimizer_step(
                lambda: self.precision_plugin.optimizer_step(optimizer, model=model, closure=closure, **kwargs)
            )
        remote = RemoteStepOptimizer(optimizer, self._asynchronous_update)
        return self.precision_plugin.optimizer_step(remote, model=model, closure=closure, **kwargs)

    def _asynchronous_update(self, closure: Callable[[], Any]) -> Any:
        result = closure()
        self._mark_compute_end()
        trainer = self._attached_trainer
        assert trainer is not None and self._client is not None and self._flat_model is not None
        flags = FLAG_LAST if is_last_batch(trainer) else 0
        self._joined = not flags
        header = self._client.push(
            self._flat_model.params, flags, self.version, self._share(), trainer.current_epoch, self._chunk
        )
        self.version = header.version
        self._last_staleness = header.staleness if header.status == STATUS_OK else 0
        self._set_step_counter(header.version, in_step=True)
        return result

    def _pull(self, flags: int = 0) -> None:
        assert self._client is not None
        self.version = self._client.pull(self.version, flags).version
        self._set_step_counter(self.version, in_step=False)

    def _share(self) -> float:
        return float(self._batch_share()) if self._batch_share is not None else equal_share(self.world_size)

    def _mark_compute_end(self) -> None:
        if self._compute_timer is not None:
            self._compute_timer.mark_compute_end()

    def _set_step_counter(self, version: int, in_step: bool) -> None:
        """Make ``trainer.global_step`` the number of updates the model received (the loop adds one after a step)."""
        assert self._attached_trainer is not None
        set_global_step(self._attached_trainer, version, in_step)

    # ------------------------------------------------------------------ validation

    @override
    def on_validation_start(self) -> None:
        trainer = self._attached_trainer
        if self._active and self._mode == "asp" and trainer is not None and trainer.state.fn == TrainerFn.FITTING:
            self._meet()
            self._pull()
            self._average_buffers()
            self._reshard_validation(trainer)
