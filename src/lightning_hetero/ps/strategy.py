"""``AsyncPSStrategy``: asynchronous parameter-server training (ASP) and synchronous all-reduce (BSP) in one
Lightning strategy, switchable between epochs.

Topology: launched like DDP (``devices=N`` processes, or several nodes through Lightning's cluster environments);
all N processes are workers and the parameter server (PS) runs as threads inside global rank 0, one receiving
thread per remote worker. See ``docs/async_ps.md`` for how steps, epochs, logging, checkpoints and faults work.
"""

from __future__ import annotations

import copy
import signal
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.fabric.strategies import _StrategyRegistry
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.fabric.utilities.types import ReduceOp
from lightning.pytorch.overrides.distributed import _sync_module_states
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.data import _update_dataloader
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import Tensor
from torch.optim import Optimizer
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler
from typing_extensions import override

from lightning_hetero._validation import check_finite
from lightning_hetero.ps.compensation import (
    AsynchronyCompensator,
    check_compensation_mode,
    momentum_of,
    unsupported_reason,
)
from lightning_hetero.ps.fault_tolerance import LOST_WORKER_GRACE_S, FaultTolerance
from lightning_hetero.ps.faults import FaultBoard, Membership
from lightning_hetero.ps.layout import FlatLayout, bind_parameters_to_flat, flatten_grads_into
from lightning_hetero.ps.protocol import (
    FLAG_JOIN,
    FLAG_LAST,
    FLAG_PULL_ONLY,
    SERVER_RANK,
    STATUS_ABORTED,
    STATUS_OK,
    PeerLostError,
    ReplyHeader,
    all_reduce_weighted,
    new_message,
    payload,
    push_and_pull,
    read_push_header,
    send_done,
    write_push_header,
)
from lightning_hetero.ps.sampler import ClaimSampler
from lightning_hetero.ps.server import ParameterServer, ServerLoop
from lightning_hetero.ps.staleness import staleness_lr_factor
from lightning_hetero.schedules import StepSchedules

MODES = ("asp", "bsp")
ON_WORKER_LOST = ("fail", "continue")
# The server's threads block in receives for as long as their worker is alive (it may validate, or the strategy may
# train synchronously for many epochs); a dead worker breaks the connection at once, so no timeout is needed there.
_SERVER_RECEIVE_TIMEOUT = timedelta(days=7)
# How often rank 0 logs the hyper-parameters in force (ps/momentum_effective, ps/lr_effective), in its batches.
_LOG_EVERY_N_BATCHES = 8


def _hyperparameters(param_group: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in param_group.items() if key != "params"}


def _rounded(value: float | None) -> str:
    return "None" if value is None else f"{value:.4g}"


class _RemoteStepOptimizer:
    """Stands in for the user's optimizer in asynchronous mode: ``step`` runs the closure (forward, backward, hooks,
    clipping) and then hands the gradients to the parameter server instead of updating locally."""

    def __init__(self, optimizer: Optimizer, remote_step: Callable[[Callable[[], Any]], Any]) -> None:
        self._optimizer = optimizer
        self._remote_step = remote_step

    def step(self, closure: Callable[[], Any], **kwargs: Any) -> Any:
        return self._remote_step(closure)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)


class AsyncPSStrategy(FaultTolerance, DDPStrategy):
    """Asynchronous parameter-server training (``mode="asp"``) or synchronous all-reduce (``mode="bsp"``).

    In ASP each worker computes gradients on its own batch and pushes them (one flat buffer) to the parameter server,
    which applies the user's optimizer at once, bumps its version and replies with the new parameters (one flat
    buffer); faster workers make more updates. In BSP every rank all-reduces its share-weighted gradients and steps
    its own copy of the optimizer, as DDP does. :meth:`set_mode` switches between the two at an epoch's end.

    Args:
        mode: ``"asp"`` or ``"bsp"``; can be changed later with :meth:`set_mode`.
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
            the job either way.
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
        mode: str = "asp",
        max_staleness: int | None = None,
        lr_scaling: str = "none",
        asynchrony_compensation: str | None = "auto",
        fault_timeout_s: float = 60.0,
        startup_timeout_s: float = 300.0,
        on_worker_lost: str = "fail",
        accelerator: pl.accelerators.Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: Any = None,
        checkpoint_io: Any = None,
        precision_plugin: Any = None,
        process_group_backend: str | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
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
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=timedelta(seconds=startup_timeout_s),
        )
        self._mode = mode
        self.max_staleness = max_staleness
        self.lr_scaling = lr_scaling
        self._compensation_mode = asynchrony_compensation
        self._compensation_announced = False
        self.fault_timeout_s = fault_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.on_worker_lost = on_worker_lost
        #: seconds the last effective :meth:`set_mode` took (``None`` before any switch)
        self.last_switch_s: float | None = None
        #: updates applied to the model so far (the server's version in ASP, the step count in BSP)
        self.version = 0
        #: the server's statistics (rank 0, after fitting): updates, per-worker updates, staleness mean and max
        self.server_summary: dict[str, Any] | None = None
        self._compute_timer: Any = None
        self._batch_share: Callable[[], float] | None = None
        self._last_staleness = 0
        self._snapshot: dict[str, Any] | None = None
        self._restored: dict[str, Any] | None = None
        self._active = False
        self._joined = False
        self._server: ParameterServer | None = None
        self._loop: ServerLoop | None = None
        self._step_schedules = StepSchedules()
        self._group: dist.ProcessGroup | None = None
        self._store: dist.Store | None = None
        self._membership: Membership | None = None
        self._needs_meeting = False
        self._claim_sampler: ClaimSampler | None = None
        self._chunk = -1
        self._launched: list[Any] = []
        self._validation_members: list[int] = []

    # ------------------------------------------------------------------ public API

    @property
    def mode(self) -> str:
        return self._mode

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
        if self._server is not None:
            with self._server.cond:
                self._server.compensator = self._new_compensator()

    def _new_compensator(self) -> AsynchronyCompensator | None:
        if self._compensation_mode is None:
            return None
        compensator = AsynchronyCompensator(self._compensation_mode, workers=self.world_size)
        compensator.apply([_hyperparameters(group) for group in self.optimizers[0].param_groups])
        return compensator

    def set_mode(self, mode: str) -> None:
        """Switch between ``"asp"`` and ``"bsp"``; call on every rank with the same value at an epoch's end (e.g. from
        ``on_train_epoch_end``). Takes effect for the next epoch without restarting processes. Entering BSP gives
        every rank the server's parameters, optimizer state and version; entering ASP loads rank 0's into the server.
        The time taken is kept in :attr:`last_switch_s`.

        Args:
            mode: ``"asp"`` or ``"bsp"``.
        """
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == self._mode:
            return
        if not self._active:
            self._mode = mode
            return
        start = time.perf_counter()
        if mode == "bsp":
            self._meet()  # brings every rank's view of the lost ranks up to date
            self._check_no_rank_lost("switch to BSP")
            self._enter_bsp()
        else:
            self._enter_asp()
        self._mode = mode
        if self._server is not None:
            self._server.tolerate_lost_workers = self._tolerates_lost_workers()
        self.last_switch_s = time.perf_counter() - start

    def attach_hetero_batches(self, compute_timer: Any, batch_share: Callable[[], float]) -> None:
        """Connect per-rank batch sizes (called once at setup by ``HeteroBatchCallback``).

        The strategy calls ``compute_timer.mark_compute_end()`` as soon as local gradients are ready, before any
        communication. In BSP gradients are multiplied by ``batch_share()`` before a SUM all-reduce (a batch-weighted
        mean); in ASP an update's gradient is multiplied by ``batch_share() * world_size`` (1 for equal shares), so a
        worker's update weighs as much as its data would in the synchronous mean.

        Args:
            compute_timer: a :class:`~lightning_hetero.measurement.ComputeTimer`.
            batch_share: returns this rank's ``b_k / sum(b)`` for the current step.
        """
        if self.on_worker_lost == "continue":
            raise ValueError(
                "AsyncPSStrategy(on_worker_lost='continue') does not support HeteroBatchCallback: its split of each "
                "global batch assumes a fixed set of ranks. Use on_worker_lost='fail' with it."
            )
        self._compute_timer = compute_timer
        self._batch_share = batch_share

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        if cls.strategy_name not in strategy_registry:
            strategy_registry.register(
                cls.strategy_name, cls, description="Asynchronous parameter-server training (lightning-hetero)"
            )

    # ------------------------------------------------------------------ setup and teardown

    @override
    def setup_distributed(self) -> None:
        try:
            super().setup_distributed()
        except RuntimeError as err:
            raise RuntimeError(
                f"AsyncPSStrategy: the {self.num_nodes * self.num_processes} ranks did not all join within "
                f"startup_timeout_s={self.startup_timeout_s:g} ({str(err).splitlines()[0]}); start every rank, or "
                "raise startup_timeout_s on a busy machine."
            ) from err
        # start-up may take long on a busy cluster; once running, a peer that stops answering is a fault
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=self.fault_timeout_s))

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None and self.model is not None
        self.accelerator.setup(trainer)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        fitting = trainer.state.fn == TrainerFn.FITTING
        if fitting:
            self._check_trainer(trainer)
            self.setup_optimizers(trainer)
            if len(self.optimizers) != 1:
                raise ValueError(
                    f"AsyncPSStrategy supports exactly one optimizer; configure_optimizers returned "
                    f"{len(self.optimizers)}."
                )
        self.setup_precision_plugin()
        if fitting:
            _optimizers_to_device(self.optimizers, self.root_device)
            self._setup_server(trainer)
        else:
            _sync_module_states(self.model)

    def _check_trainer(self, trainer: pl.Trainer) -> None:
        module = self.lightning_module
        assert module is not None
        if not module.automatic_optimization:
            raise ValueError(
                "AsyncPSStrategy supports automatic optimization only; the parameter server applies the optimizer. "
                "Remove `self.automatic_optimization = False`."
            )
        if isinstance(trainer.val_check_interval, int) or getattr(trainer, "_val_check_time_interval", None):
            raise ValueError(
                "AsyncPSStrategy validates at epoch ends only (ranks run different numbers of batches in ASP); "
                f"got val_check_interval={trainer.val_check_interval!r}."
            )

    def _setup_server(self, trainer: pl.Trainer) -> None:
        module = self.lightning_module
        assert module is not None
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("AsyncPSStrategy: the model has no trainable parameters.")
        kinds = {(p.device, p.dtype) for _, p in named}
        if len(kinds) != 1 or not named[0][1].is_floating_point():
            raise ValueError(
                "AsyncPSStrategy needs all trainable parameters on one device with one floating dtype to lay them "
                f"out in a flat buffer; found {sorted(str(k) for k in kinds)}."
            )
        self._layout = FlatLayout.from_named_parameters(named)
        self._params = [p for _, p in named]
        self._flat = torch.empty(self._layout.numel, dtype=self._params[0].dtype, device=self._params[0].device)
        bind_parameters_to_flat(self._params, self._flat)
        self._grad_flat = torch.empty_like(self._flat)
        _sync_module_states(module)

        pin = self.root_device.type == "cuda"
        self._push = new_message(self._layout.numel, pin_memory=pin)
        self._reply = new_message(self._layout.numel, pin_memory=pin)
        self._group = dist.new_group(backend="gloo", timeout=_SERVER_RECEIVE_TIMEOUT)
        self._store = self._connect_store()
        if self.global_rank == SERVER_RANK:
            self._server = ParameterServer(
                self._layout,
                self._flat,
                self.optimizers[0],
                {id(p): i for i, p in enumerate(self._params)},
                world_size=self.world_size,
                max_staleness=self.max_staleness,
                lr_scaling=self.lr_scaling,
                compensator=self._new_compensator(),
            )
            reason = unsupported_reason(self.optimizers[0]) if self._compensation_mode is not None else None
            if reason is not None:
                rank_zero_warn(f"AsyncPSStrategy(asynchrony_compensation={self._compensation_mode!r}): {reason}.")
            self._server.max_updates = trainer.max_steps
            self._server.on_update = self._step_schedules.step_at
            self._server.tolerate_lost_workers = self._tolerates_lost_workers()
            self._server.on_lost = self._on_rank_lost
            workers = [rank for rank in range(self.world_size) if rank != SERVER_RANK]
            self._loop = ServerLoop(self._server, workers, self._group, timedelta(seconds=self.fault_timeout_s))
            self._loop.start()
        self._launched = list(self.launcher.procs) if isinstance(self.launcher, _SubprocessScriptLauncher) else []
        self._validation_members = list(range(self.world_size))
        self._membership = Membership(FaultBoard(self._store), self.global_rank, self.world_size, self.fault_timeout_s)
        self._install_local_sigterm_check(trainer)
        self._active = True

    def _connect_store(self) -> dist.Store:
        """A key-value store hosted by rank 0 for the epoch's shared claim counters."""
        assert self.cluster_environment is not None
        host = self.cluster_environment.main_address
        timeout = timedelta(seconds=self.fault_timeout_s)
        if self.global_rank == SERVER_RANK:
            store = dist.TCPStore(host, 0, None, True, timeout=timeout, wait_for_workers=False)
            port = store.port
        else:
            port = None
        port = self.broadcast(port, src=SERVER_RANK)
        if self.global_rank != SERVER_RANK:
            store = dist.TCPStore(host, port, None, False, timeout=timeout)
        return store

    def _install_local_sigterm_check(self, trainer: pl.Trainer) -> None:
        # Lightning broadcasts a SIGTERM flag from rank 0 before every training batch. In ASP ranks run different
        # numbers of batches, so that broadcast would pair unrelated batches and deadlock at the epoch's end; while
        # asynchronous, each rank checks its own flag instead.
        epoch_loop = trainer.fit_loop.epoch_loop
        synchronous_check = getattr(epoch_loop, "_broadcast_sigterm_tensor", None)
        if synchronous_check is None:
            return

        def sigterm_check() -> None:
            if self._mode == "bsp":
                synchronous_check()
            elif getattr(trainer, "received_sigterm", False):
                raise SIGTERMException()

        epoch_loop._broadcast_sigterm_tensor = sigterm_check

    @override
    def on_train_start(self) -> None:
        if self._restored is not None:
            self._set_step_counter(self.version, in_step=False)
        if self._mode == "asp":
            self._take_over_step_schedules()
            self._announce_compensation()

    def _announce_compensation(self) -> None:
        """Say once, on rank 0, which hyper-parameters the server uses in ASP."""
        if self._compensation_announced or self._server is None:
            return
        self._compensation_announced = True
        user = self.optimizers[0].param_groups[0]
        compensator = self._server.compensator
        if compensator is None:
            rank_zero_info(
                f"AsyncPSStrategy: ASP uses the optimizer's hyper-parameters as they are (lr {user['lr']:g}, "
                f"momentum {momentum_of(user)}); asynchrony_compensation=None"
            )
            return
        rank_zero_info(
            f"AsyncPSStrategy: asynchrony_compensation={self._compensation_mode!r}: in ASP with "
            f"{compensator.n_eff:g} effective workers the server uses momentum "
            f"{_rounded(compensator.momentum_effective)} (yours {momentum_of(user)}) and lr "
            f"{_rounded(compensator.lr_effective)} (yours {user['lr']:g}), updated from the measured staleness "
            "(logged as ps/momentum_effective, ps/lr_effective); BSP uses yours."
        )

    def _take_over_step_schedules(self) -> None:
        """In ASP, step-interval LR schedulers count the server's updates (rank 0's schedulers, which the server's
        hyper-parameters follow), not each rank's own batches."""
        trainer = self._trainer()
        assert trainer is not None
        self._step_schedules.take_over(trainer.lr_scheduler_configs)

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
            self.server_summary = self._server.tracker.summary()
        if self.global_rank == SERVER_RANK:
            assert self._loop is not None
            self._loop.join(self.fault_timeout_s)
        else:
            assert self._group is not None
            send_done(self._push, SERVER_RANK, self._group, timedelta(seconds=self.fault_timeout_s))
        self._active = False

    @override
    def teardown(self) -> None:
        self._active = False
        self._loop = None
        self._store = None
        super().teardown()

    # ------------------------------------------------------------------ data

    @override
    def process_dataloader(self, dataloader: object) -> object:
        """Give the training loader a :class:`~lightning_hetero.ps.sampler.ClaimSampler` (in place of Lightning's
        ``DistributedSampler``), so that in ASP faster workers take more batches and the epoch still covers the data
        once. Loaders with a custom sampler or batch sampler are left alone."""
        trainer = self._trainer()
        if (
            trainer is None
            or not self._active
            or trainer.state.fn != TrainerFn.FITTING
            or trainer.state.stage != RunningStage.TRAINING
            or not trainer._accelerator_connector.use_distributed_sampler
            or not isinstance(dataloader, DataLoader)
            or dataloader.batch_size is None
        ):
            return dataloader
        sampler = dataloader.sampler
        if isinstance(sampler, DistributedSampler):
            shuffle, seed = sampler.shuffle, sampler.seed
        elif isinstance(sampler, (RandomSampler, SequentialSampler)):
            shuffle, seed = isinstance(sampler, RandomSampler), 0
        else:
            return dataloader  # a custom sampler decides itself which rank sees what
        claim_sampler = ClaimSampler(
            len(dataloader.dataset),
            dataloader.batch_size,
            self._claim,
            epoch=lambda: trainer.current_epoch,
            asynchronous=lambda: self._mode == "asp",
            rank=self.global_rank,
            world_size=self.world_size,
            shuffle=shuffle,
            seed=seed,
            tail=self._lost_workers_chunks if self._server is not None and self.on_worker_lost == "continue" else None,
        )
        self._claim_sampler = claim_sampler
        return _update_dataloader(dataloader, claim_sampler, mode=RunningStage.TRAINING)

    def _claim(self, epoch: int, count: int) -> int:
        assert self._store is not None
        try:
            return self._store.add(f"claims/epoch{epoch}", count) - count
        except RuntimeError as err:
            raise self._lost_cause(err) from err

    # ------------------------------------------------------------------ stepping

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        if self._mode == "asp" and self._active:
            if not self._joined:
                # the epoch's first batch: start on the latest parameters and count for the staleness bound from now on
                self._pull(FLAG_JOIN)
                self._joined = True
            self._chunk = self._claim_sampler.next_chunk() if self._claim_sampler is not None else -1
            # the epoch's first collective after its asynchronous batches is preceded by a meeting of the ranks
            self._needs_meeting = True
        output = super().training_step(*args, **kwargs)
        self._log_hyperparameters_in_force()
        if self._mode == "asp" and self._active:
            # logged at every asynchronous step on every rank (each rank trains at least one batch per epoch), so
            # the epoch-end synchronisation of these two keys is matched across ranks
            module = self.lightning_module
            assert module is not None
            staleness = float(self._last_staleness or 0)
            module.log("ps/staleness", staleness, on_step=False, on_epoch=True, batch_size=1, sync_dist=True)
            module.log(
                "ps/staleness_max",
                staleness,
                on_step=False,
                on_epoch=True,
                batch_size=1,
                sync_dist=True,
                reduce_fx="max",
            )
        return output

    def _log_hyperparameters_in_force(self) -> None:
        """Rank 0 logs the first param group's momentum and learning rate that updates use: the server's
        compensated values in ASP, the optimizer's own in BSP (on every 8th batch and the last: ``self.log`` costs
        tens of microseconds, and rank 0 also serves the other workers)."""
        if not self._active or self.global_rank != SERVER_RANK:
            return
        trainer = self._trainer()
        assert trainer is not None
        progress = trainer.fit_loop.epoch_loop.batch_progress
        if progress.current.ready % _LOG_EVERY_N_BATCHES != 1 and not progress.is_last_batch:
            return
        module = self.lightning_module
        assert module is not None
        compensator = self._server.compensator if self._server is not None and self._mode == "asp" else None
        if compensator is not None:
            momentum, lr = compensator.momentum_effective, compensator.lr_effective
        else:
            group = self.optimizers[0].param_groups[0]
            momentum, lr = momentum_of(group), group["lr"]
        for name, value in (("ps/momentum_effective", momentum), ("ps/lr_effective", lr)):
            if isinstance(value, (int, float)):
                module.log(name, float(value), on_step=False, on_epoch=True, batch_size=1, rank_zero_only=True)

    @override
    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        model = model or self.lightning_module
        if not self._active:
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        if self._mode == "bsp":

            def synchronised_closure() -> Any:
                result = closure()
                self._mark_compute_end()
                self._all_reduce_gradients()
                return result

            output = self.precision_plugin.optimizer_step(
                optimizer, model=model, closure=synchronised_closure, **kwargs
            )
            self.version += 1
            return output
        remote = _RemoteStepOptimizer(optimizer, self._asynchronous_update)
        return self.precision_plugin.optimizer_step(remote, model=model, closure=closure, **kwargs)

    def _asynchronous_update(self, closure: Callable[[], Any]) -> Any:
        result = closure()
        self._mark_compute_end()
        trainer = self._trainer()
        assert trainer is not None
        flags = FLAG_LAST if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch else 0
        self._joined = not flags
        flatten_grads_into(self._params, payload(self._push))
        write_push_header(self._push, flags, self.version, self._share(), trainer.current_epoch, self._chunk)
        header = self._exchange()
        self._last_staleness = header.staleness if header.status == STATUS_OK else 0
        self._set_step_counter(header.version, in_step=True)
        return result

    def _exchange(self) -> ReplyHeader:
        """Send the filled push message to the server (directly when it lives in this process) and absorb the reply."""
        if self._server is not None:
            header = self._server.apply(
                self.global_rank, read_push_header(self._push), payload(self._push), self._reply
            )
        else:
            assert self._group is not None
            try:
                header = push_and_pull(
                    self._push, self._reply, SERVER_RANK, self._group, timedelta(seconds=self.fault_timeout_s)
                )
            except PeerLostError as err:
                raise self._lost_cause(err) from err
        if header.status == STATUS_ABORTED:
            lost = self._server.lost if self._server is not None else None
            if lost is not None:
                raise PeerLostError(lost.rank, lost.role, lost.cause)
            recorded = self._recorded_fault(LOST_WORKER_GRACE_S)
            if recorded is not None and recorded.rank == header.lost_rank:
                raise recorded
            raise PeerLostError(header.lost_rank, "worker", "reported by the parameter server")
        self._flat.copy_(payload(self._reply), non_blocking=self._reply.is_pinned())
        self.version = header.version
        return header

    def _pull(self, flags: int = 0) -> None:
        write_push_header(self._push, FLAG_PULL_ONLY | flags, self.version, 0.0)
        self._exchange()
        self._set_step_counter(self.version, in_step=False)

    def _share(self) -> float:
        return float(self._batch_share()) if self._batch_share is not None else 1.0 / self.world_size

    def _mark_compute_end(self) -> None:
        if self._compute_timer is not None:
            self._compute_timer.mark_compute_end()

    def _all_reduce_gradients(self) -> None:
        flatten_grads_into(self._params, self._grad_flat)
        self._collective(lambda: all_reduce_weighted(self._grad_flat, self._share()))
        for param, grad in zip(self._params, self._layout.views(self._grad_flat), strict=True):
            if param.grad is None:
                param.grad = grad.clone()
            else:
                param.grad.copy_(grad)

    def _set_step_counter(self, version: int, in_step: bool) -> None:
        """Make ``trainer.global_step`` the number of updates the model received (the loop adds one after a step)."""
        trainer = self._trainer()
        assert trainer is not None
        counter = trainer.fit_loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step.total
        counter.ready = version
        counter.completed = version - 1 if in_step else version

    # ------------------------------------------------------------------ mode switches

    def _enter_bsp(self) -> None:
        self._average_buffers()
        self._step_schedules.release()
        optimizer = self.optimizers[0]
        trainer = self._trainer()
        assert trainer is not None
        schedulers = [config.scheduler for config in trainer.lr_scheduler_configs]
        if self._server is not None:
            state = self._server.state_dict()
            self._flat.copy_(state["params"])
            # the server's hyper-parameters date from its last update; rank 0's are the schedules' current ones
            current = [_hyperparameters(group) for group in optimizer.param_groups]
            payload_obj = (state["optimizer"], state["version"], current, [s.state_dict() for s in schedulers])
        else:
            payload_obj = None
        optimizer_state, version, current, scheduler_states = super().broadcast(payload_obj, src=SERVER_RANK)
        optimizer.load_state_dict(copy.deepcopy(optimizer_state))
        for group, hyperparameters in zip(optimizer.param_groups, current, strict=True):
            group.update(hyperparameters)
        if self.global_rank != SERVER_RANK:  # schedulers counted server updates on rank 0 only
            for scheduler, scheduler_state in zip(schedulers, scheduler_states, strict=True):
                scheduler.load_state_dict(scheduler_state)
        _optimizers_to_device(self.optimizers, self.root_device)
        _sync_module_states(self.lightning_module)
        self.version = version
        self._set_step_counter(version, in_step=False)

    def _enter_asp(self) -> None:
        self._joined = False
        self._take_over_step_schedules()
        if self._server is not None:
            self._server.load(self._flat, copy.deepcopy(self.optimizers[0].state_dict()), self.version)
            self._announce_compensation()
        self._meet()

    # ------------------------------------------------------------------ collectives while asynchronous

    @override
    def on_exception(self, exception: BaseException) -> None:
        super().on_exception(exception)
        if self._active and self._membership is not None:
            self._announce_failure(exception)
        # Lightning leaves the processes it launched running when the main one fails (except on KeyboardInterrupt);
        # a hung worker would then outlive the job. A lost one is no longer in the launcher's list (see
        # _on_rank_lost), but may be hung rather than dead.
        if isinstance(self.launcher, _SubprocessScriptLauncher):
            for proc in self._launched:
                if proc.poll() is None:
                    proc.kill()
            self.launcher.kill(signal.SIGKILL)

    def _trainer(self) -> pl.Trainer | None:
        module = self.lightning_module
        return None if module is None else module._trainer

    def _inside_asynchronous_batch(self) -> bool:
        """True inside a training batch in ASP, where ranks are not in lock-step and collectives must stay local."""
        if self._mode != "asp" or not self._active:
            return False
        trainer = self._trainer()
        if trainer is None or trainer.state.stage != RunningStage.TRAINING:
            return False
        progress = trainer.fit_loop.epoch_loop.batch_progress.current
        return progress.ready > progress.completed

    @override
    def reduce(self, tensor: Tensor | Any, group: Any = None, reduce_op: ReduceOp | str | None = "mean") -> Any:
        if self._inside_asynchronous_batch():
            return tensor
        group = self._collective_group(group)
        return self._collective(lambda: super(AsyncPSStrategy, self).reduce(tensor, group, reduce_op))

    @override
    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        if self._inside_asynchronous_batch():
            return decision
        members = len(self._membership.members) if self._membership is not None else self.world_size
        count = self.reduce(torch.tensor(int(decision), device=self.root_device), reduce_op=ReduceOp.SUM)
        return bool(count == members) if all else bool(count)

    @override
    def barrier(self, *args: Any, **kwargs: Any) -> None:
        if self._inside_asynchronous_batch():
            return
        group = self._collective_group()
        if group is None:
            self._collective(lambda: super(AsyncPSStrategy, self).barrier(*args, **kwargs))
        else:
            self._collective(lambda: dist.barrier(group=group))

    @override
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if self._inside_asynchronous_batch():
            return obj
        group = self._collective_group()
        if group is None:
            return self._collective(lambda: super(AsyncPSStrategy, self).broadcast(obj, src))
        objects = [obj]
        self._collective(lambda: dist.broadcast_object_list(objects, src, group=group))
        return objects[0]

    @override
    def all_gather(self, tensor: Tensor, group: Any = None, sync_grads: bool = False) -> Tensor:
        if self._inside_asynchronous_batch():
            return tensor.unsqueeze(0)
        group = self._collective_group(group)
        return self._collective(lambda: super(AsyncPSStrategy, self).all_gather(tensor, group, sync_grads))

    # ------------------------------------------------------------------ validation and checkpoints

    @override
    def on_validation_start(self) -> None:
        trainer = self._trainer()
        if self._active and self._mode == "asp" and trainer is not None and trainer.state.fn == TrainerFn.FITTING:
            self._meet()
            self._pull()
            self._average_buffers()
            self._reshard_validation(trainer)

    @property
    @override
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        members = self._membership.members if self._membership is not None else None
        if members is None or len(members) == self.world_size:
            return super().distributed_sampler_kwargs
        return {"num_replicas": len(members), "rank": members.index(self.global_rank)}

    def _average_buffers(self) -> None:
        """Average the workers' floating-point module buffers (BatchNorm running statistics): in ASP each worker
        updates its own from its own batches, and the server holds parameters only. Called where all ranks meet."""
        buffers = [b for b in self.lightning_module.buffers() if b.is_floating_point()]
        if not buffers or self.world_size == 1:
            return
        flat = torch.cat([b.detach().reshape(-1).to(torch.float64) for b in buffers])
        group = self._collective_group()
        flat = self._collective(lambda: super(AsyncPSStrategy, self).reduce(flat, group, reduce_op="mean"))
        offset = 0
        for buffer in buffers:
            buffer.copy_(flat[offset : offset + buffer.numel()].view_as(buffer))
            offset += buffer.numel()

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        state = super().lightning_module_state_dict()
        if self._server is None or self._mode != "asp" or not self._active:
            return state
        self._snapshot = self._server.state_dict()
        for name, value in zip(self._layout.names, self._layout.views(self._snapshot["params"]), strict=True):
            state[name] = value.to(dtype=state[name].dtype)
        return state

    @override
    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        if self._snapshot is None:
            return super().optimizer_state(optimizer)
        # the server's state, with the hyper-parameters rank 0's schedulers set since the server's last update
        state = self._snapshot["optimizer"]
        for saved, group in zip(state["param_groups"], self.optimizers[0].param_groups, strict=True):
            saved.update(_hyperparameters(group))
        return state

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        version = self._snapshot["version"] if self._snapshot is not None else self.version
        self._snapshot = None
        checkpoint["async_ps"] = {"version": version, "mode": self._mode}
        super().save_checkpoint(checkpoint, filepath, storage_options)

    @property
    @override
    def restore_checkpoint_after_setup(self) -> bool:
        return True

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        self._restored = checkpoint.get("async_ps")
        if self._restored is not None:
            self.version = int(self._restored["version"])
            self._mode = self._restored["mode"]
        return checkpoint

    @override
    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        super().load_model_state_dict(checkpoint, strict=strict)
        if self._server is not None:
            self._server.load(self._flat, None, self.version)

    @override
    def load_optimizer_state_dict(self, checkpoint: Any) -> None:
        super().load_optimizer_state_dict(checkpoint)
        if self._server is not None:
            self._server.load(self._flat, checkpoint["optimizer_states"][0], self.version)
