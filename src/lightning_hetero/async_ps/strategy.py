"""``AsyncPSStrategy``: the Lightning strategy's lifecycle and hooks, one engine per mode
(:mod:`~lightning_hetero.async_ps.engines`) and the collaborators built at setup (:mod:`~lightning_hetero.async_ps.runtime.bootstrap`);
``docs/async_ps.md`` tells how steps, epochs, logging, checkpoints and faults work."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

from lightning_hetero._lightning_internals import (
    load_strategy_checkpoint,
    optimizers_to_device,
    replace_sigterm_broadcast,
    set_default_group_timeout,
    sync_module_states,
)
from lightning_hetero._registration import DESCRIPTION
from lightning_hetero.asp.compensation import Compensation
from lightning_hetero.asp.placement import concurrency, refuse_hetero_batches
from lightning_hetero.async_ps.engines import ENGINES, Engine, switch
from lightning_hetero.async_ps.runtime import bootstrap
from lightning_hetero.async_ps.runtime.checkpointing import Checkpointing
from lightning_hetero.async_ps.runtime.collectives import broadcast_object
from lightning_hetero.async_ps.runtime.context import BatchWeighting, StepCounter
from lightning_hetero.async_ps.runtime.fault_tolerance import kill_launched
from lightning_hetero.async_ps.runtime.reducer import DDPReducer, name_the_setting
from lightning_hetero.async_ps.runtime.reporting import EpochLog
from lightning_hetero.async_ps.runtime.trainer_limits import TrainerLimits
from lightning_hetero.async_ps.settings import PSAdvanced, PSSettings, old_keywords, read_only_settings
from lightning_hetero.contracts import ComputeEndMark, Mode, check_mode
from lightning_hetero.local_sgd.rounds import LocalRounds
from lightning_hetero.lr_schedules import CountedLRSchedulers


class AsyncPSStrategy(DDPStrategy):
    """Asynchronous parameter-server training (``mode="asp"``: workers push gradients to a server that steps the
    user's optimizer), synchronous all-reduce of share-weighted gradients (``"bsp"``) or local SGD (``"local"``:
    rounds of local steps, then an outer step, DiLoCo). :meth:`set_mode` switches at epoch ends.

    Args:
        mode: ``"asp"``, ``"bsp"`` or ``"local"``; can be changed later with :meth:`set_mode`.
        max_staleness: a worker this many own updates ahead of the slowest waits (``None``: no bound, pure ASP).
        asynchrony_compensation: ``"auto"``: in ASP the server lowers SGD's momentum (then the learning rate) by the
            measured staleness, other optimizers keep theirs (:mod:`~lightning_hetero.asp.compensation`); ``"dc"``: also
            delay-compensated gradients (Zheng et al., 2017); ``None``: the user's hyper-parameters as they are.
        fault_timeout_s: how long any rank waits for a peer before failing with an error naming it.
        on_worker_lost: ``"fail"`` ends the job when a rank is lost; ``"continue"`` (elastic ASP): in ASP the others
            train on without a lost rank but 0, which takes its unfinished batches; refused with ``mode="local"``.
        round_length: local SGD: local steps per rank on average (an int, split by speed), ``"<T>s"`` (seconds) or
            ``"<N> samples"`` (over all ranks).
        outer_optimizer: local SGD: the outer optimizer's class (default ``torch.optim.SGD``).
        outer_optimizer_kwargs: its arguments (default ``lr=1.0``: plain averaging; DiLoCo's: 0.7, Nesterov 0.9).
        advanced: :class:`~lightning_hetero.async_ps.settings.PSAdvanced`, the expert knobs.
        accelerator: as :class:`~lightning.pytorch.strategies.DDPStrategy` takes it.
        parallel_devices: as :class:`~lightning.pytorch.strategies.DDPStrategy` takes it.
        cluster_environment: as :class:`~lightning.pytorch.strategies.DDPStrategy` takes it.
        checkpoint_io: as :class:`~lightning.pytorch.strategies.DDPStrategy` takes it.
        precision_plugin: as :class:`~lightning.pytorch.strategies.DDPStrategy` takes it.
        process_group_backend: backend of the default group (used in BSP); the server always talks gloo.
        **deprecated: the old keywords (``round_samples``, ``round_s``, the expert knobs), with a warning.

    Notes:
        Exactly one optimizer; manual optimization in BSP only. In ASP ``trainer.global_step`` is the server's version,
        ``max_steps x world_size`` bounds it (DDP's data); every rank stops, and validates, at agreed points.

    Example::

        >>> strategy = AsyncPSStrategy(mode="bsp", max_staleness=4)
        >>> strategy.mode, strategy.in_lock_step, strategy.max_staleness, strategy.last_switch_s
        ('bsp', True, 4, None)
        >>> strategy.set_mode("asp")  # before training: recorded for the start
        >>> strategy.mode, strategy.in_lock_step
        ('asp', False)
        >>> AsyncPSStrategy(mode="local", round_length="30s", advanced=PSAdvanced(local_steps="equal")).round_length
        '30s'
    """

    strategy_name = "async_ps"
    max_staleness, fault_timeout_s, on_worker_lost, round_length = read_only_settings(4)
    lr_scaling, startup_timeout_s, local_steps, pseudo_gradient_weighting = read_only_settings(4, moved=True)
    overlap_round_trip, server_shards, server_placement = read_only_settings(3, moved=True)

    def __init__(
        self, mode: Mode = "asp", max_staleness: int | None = None, asynchrony_compensation: str | None = "auto",
        fault_timeout_s: float = 60.0, on_worker_lost: str = "fail", round_length: int | str = 16,
        outer_optimizer: Callable[..., torch.optim.Optimizer] | None = None,
        outer_optimizer_kwargs: dict[str, Any] | None = None, advanced: PSAdvanced | None = None,
        accelerator: pl.accelerators.Accelerator | None = None, parallel_devices: list[torch.device] | None = None,
        cluster_environment: Any = None, checkpoint_io: Any = None, precision_plugin: Any = None,
        process_group_backend: str | None = None, **deprecated: Any,
    ) -> None:  # fmt: skip
        round_length, advanced = old_keywords(round_length, advanced, deprecated)
        settings = PSSettings(
            mode, max_staleness, asynchrony_compensation, fault_timeout_s, on_worker_lost, round_length,
            outer_optimizer, outer_optimizer_kwargs, advanced,
        )  # fmt: skip
        super().__init__(
            accelerator=accelerator, parallel_devices=parallel_devices, cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io, precision_plugin=precision_plugin,
            process_group_backend=process_group_backend, timeout=timedelta(seconds=advanced.startup_timeout_s),
            find_unused_parameters=advanced.find_unused_parameters,
        )  # fmt: skip
        #: the constructor's settings, checked and read-only (the attributes of the same name read them)
        self.settings = settings
        workers = lambda: concurrency(self.world_size, advanced.server_placement, advanced.overlap_round_trip)  # noqa: E731
        self._compensation = Compensation(asynchrony_compensation, workers, lambda: self.optimizers[0])
        #: seconds the last effective :meth:`set_mode` took (``None`` before any switch)
        self.last_switch_s: float | None = None
        #: rank 0, after fitting: the server's updates, staleness and costs (:meth:`.ShardHosting.summary`)
        self.server_summary: dict[str, Any] | None = None
        self._counter = StepCounter()
        self._weighting = BatchWeighting(world_size=lambda: self.world_size)
        self._engines: dict[str, Engine] = {name: new(settings, self._weighting) for name, new in ENGINES.items()}
        self._mode: Mode = mode
        self._checkpointing = Checkpointing(self._engines, self._counter)
        self._restored, self._limits = False, TrainerLimits()  # the Trainer's settings (refusals, estimates)
        self._schedules = CountedLRSchedulers()
        self._log = EpochLog(gather=lambda tensor: self.all_gather(tensor.to(self.root_device)))
        self._run: bootstrap.Run | None = None  # built at setup when fitting
        self._reducer: DDPReducer | None = None  # BSP's: built at setup when fitting

    @property
    def mode(self) -> Mode:
        """The synchronisation mode in force: ``"asp"``, ``"bsp"`` or ``"local"``."""
        return self._mode

    @property
    def in_lock_step(self) -> bool:
        """Whether the ranks train in lock-step now (in BSP); in ASP each rank runs its own number of batches."""
        return self._engine.lock_step

    @property
    def version(self) -> int:
        """Updates applied to the model so far (the server's version in ASP, the step count in BSP)."""
        return self._counter.version

    @property
    def local_rounds(self) -> LocalRounds | None:
        """Local SGD's round state (``None`` before its first batch): ``plans``, ``rounds``, ``bytes_sent``."""
        return self._engines["local"].rounds  # type: ignore[attr-defined]

    @property
    def estimated_steps_per_epoch(self) -> int | None:
        """The steps per epoch in Lightning's ``trainer.estimated_stepping_batches`` (``None`` until it was read)."""
        return self._limits.steps_per_epoch

    @property
    @override
    def is_distributed(self) -> bool:
        return True

    @property
    def asynchrony_compensation(self) -> str | None:
        """The asynchrony compensation mode (settable; takes effect at the server's next update)."""
        return self._compensation.mode

    @asynchrony_compensation.setter
    def asynchrony_compensation(self, mode: str | None) -> None:
        self._compensation.set(mode, self._run.ctx.servers.hosted if self._run is not None else None)

    def attach_hetero_batches(self, compute_timer: ComputeEndMark, batch_share: Callable[[], float]) -> None:
        """Connect per-rank batch sizes (``HeteroBatchCallback`` at setup): mark ``compute_timer`` when gradients are
        ready; weight them by :func:`~lightning_hetero.batch_weighting.gradient_weight` of ``batch_share()``.

        Args:
            compute_timer: anything with ``mark_compute_end()`` (a :class:`~lightning_hetero.measurement.ComputeTimer`).
            batch_share: returns this rank's ``b_k / sum(b)`` for the current step.
        """
        refuse_hetero_batches(self.settings.advanced.server_placement, self.on_worker_lost)
        self._weighting.attach(compute_timer, batch_share)

    def set_mode(self, mode: Mode) -> None:
        """Switch modes; call on every rank with the same value at an epoch's end (e.g. ``on_train_epoch_end``). The
        engine leaves and the next enters, in process, for the next epoch; the time taken is in :attr:`last_switch_s`.

        Args:
            mode: ``"asp"``, ``"bsp"`` or ``"local"``.
        """
        check_mode(mode)
        if mode == self._mode:
            return
        if not self._active:
            self._mode = mode
            return
        assert self._run is not None  # an active run has one
        start = time.perf_counter()
        switch(self._engine, self._engines[mode], self._run.fault)
        self._mode = mode
        self._reducer.place(self._engine.lock_step)  # type: ignore[union-attr]  # an active run has one
        self._run.fault.tell_server()
        self.last_switch_s = time.perf_counter() - start

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(cls.strategy_name, cls, description=DESCRIPTION, override=True)  # the class itself

    @property
    def _engine(self) -> Engine:
        return self._engines[self._mode]

    @property
    def _active(self) -> bool:
        return self._run is not None and self._run.ctx.active

    @override
    def setup_distributed(self) -> None:
        try:
            super().setup_distributed()
        except RuntimeError as err:
            raise bootstrap.startup_error(
                err, self.num_nodes * self.num_processes, self.settings.advanced.startup_timeout_s
            ) from err
        # start-up may take long on a busy cluster; once running, a peer that stops answering is a fault
        set_default_group_timeout(timedelta(seconds=self.fault_timeout_s))

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None and self.model is not None
        self._counter.trainer = trainer
        self.accelerator.setup(trainer)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        fitting = trainer.state.fn == TrainerFn.FITTING
        if fitting:
            self._limits.check(self.lightning_module, trainer, self._mode, self.world_size)
            self.setup_optimizers(trainer)
            bootstrap.check_optimizers(self.optimizers)
        self.setup_precision_plugin()
        if fitting:
            optimizers_to_device(self.optimizers, self.root_device)
            self._start(trainer)
        else:
            sync_module_states(self.model)

    def _start(self, trainer: pl.Trainer) -> None:
        """Build the run's context and collaborators, start the servers and hand all to the engines."""
        assert self.cluster_environment is not None
        ddp = super()  # its collectives, ungated
        ctx, group = bootstrap.build_context(
            self.settings, trainer, self.optimizers[0], self.precision_plugin, self.root_device, self.global_rank,
            self.world_size, self.cluster_environment.main_address, ddp.broadcast, self._counter, self._weighting,
            self._schedules, self._log, self._limits,
        )  # fmt: skip
        engines, compensator = self._engines.values(), self._compensation.new
        self._run = bootstrap.start_run(ctx, group, engines, lambda: self._engine, self.launcher, compensator, ddp)
        self._reducer = DDPReducer(
            self.model, self._setup_model, lambda model: setattr(self, "model", model), self._weighting
        )
        sigterm_check = lambda check: bootstrap.check_sigterm(self._engine.lock_step, trainer, check)  # noqa: E731
        replace_sigterm_broadcast(trainer, sigterm_check)

    @override
    def on_train_start(self) -> None:
        self._log.restart()
        if self._restored:
            self._counter.set(self._counter.version, in_step=False)
        self._engine.enter(switch=False)
        assert self._reducer is not None  # built at setup when fitting
        self._reducer.place(self._engine.lock_step)  # BSP trains through DDP's reducer, ASP and local SGD the module

    @override
    def on_train_end(self) -> None:
        if self._run is None or not self._run.ctx.active:
            return
        self._engine.epoch_end()
        self._schedules.release()
        self.server_summary = self._run.ctx.servers.finish()
        self._run.ctx.active = False

    @override
    def teardown(self) -> None:
        if self._run is not None:
            self._run.ctx.active = False
            self._run.ctx.servers.loop = None
        super().teardown()

    @override
    def on_exception(self, exception: BaseException) -> None:
        name_the_setting(exception)
        super().on_exception(exception)
        if self._run is not None and self._run.ctx.active:
            self._run.fault.announce_failure(exception)
        kill_launched(self.launcher, self._run.fault.launched if self._run is not None else [])

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        active, engine = self._active, self._engine
        if active:
            engine.batch_start()
        output = super().training_step(*args, **kwargs)
        if self._active:
            engine.report_step()
        return output

    @override
    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self._reducer is None or not self._reducer.placed or self._run is None:
            return super().backward(closure_loss, optimizer, *args, **kwargs)
        self._reducer.weight(closure_loss)  # BSP: the batch-weighted gradient; a broken all-reduce names who was lost
        ddp = super()
        return self._run.fault.collective(lambda: ddp.backward(closure_loss, optimizer, *args, **kwargs))

    @override
    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        model = model or self.lightning_module
        if not self._active:
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        return self._engine.optimizer_step(optimizer, closure, model, **kwargs)

    @override
    def on_validation_start(self) -> None:
        if self._active and self._run.ctx.trainer.state.fn == TrainerFn.FITTING:  # type: ignore[union-attr]
            self._engine.epoch_end()
            self._run.fault.reshard_validation(self._run.ctx.trainer)

    @override
    def process_dataloader(self, dataloader: object) -> object:
        """The training loader's claim sampler (:class:`~lightning_hetero.async_ps.runtime.claiming.DataClaiming`); before: sized."""
        return self._run.claiming.process(dataloader) if self._run is not None else self._limits.loader(dataloader)

    @property
    @override
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # after a loss in elastic ASP, the remaining ranks share the data
        kwargs = self._run.fault.sampler_kwargs() if self._run is not None else None
        return kwargs if kwargs is not None else super().distributed_sampler_kwargs

    def _gated(self, local: Callable[[], Any], run: Callable[[Any], Any], group: Any = None) -> Any:
        return self._run.gate.gated(local, run, group) if self._run is not None else run(group)

    @override
    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        ddp = super()
        return self._gated(lambda: tensor, lambda group: ddp.reduce(tensor, group, reduce_op), group)

    @override
    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        if self._run is None:
            return super().reduce_boolean_decision(decision, all)
        return self._run.gate.boolean_decision(decision, all, lambda count: self.reduce(count, reduce_op="sum"))

    @override
    def barrier(self, *args: Any, **kwargs: Any) -> None:
        ddp = super()
        self._gated(lambda: None, lambda group: ddp.barrier(*args, **kwargs) if group is None else dist.barrier(group))

    @override
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        ddp = super()
        return self._gated(lambda: obj, lambda group: broadcast_object(obj, src, group, ddp.broadcast))

    @override
    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        ddp = super()
        return self._gated(lambda: tensor.unsqueeze(0), lambda group: ddp.all_gather(tensor, group, sync_grads), group)

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        ctx = self._run.ctx if self._run is not None else None
        return self._checkpointing.model_state(super().lightning_module_state_dict(), self._engine, ctx)

    @override
    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        state = self._checkpointing.optimizer_state(optimizer)
        return state if state is not None else super().optimizer_state(optimizer)

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        position = self._run.claiming.position() if self._run is not None else None
        self._checkpointing.save_into(checkpoint, self._mode, position)
        super().save_checkpoint(checkpoint, filepath, storage_options)

    @property
    @override
    def restore_checkpoint_after_setup(self) -> bool:
        return True

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = load_strategy_checkpoint(super().load_checkpoint, checkpoint_path, weights_only)
        mode = self._checkpointing.restore(checkpoint)
        if mode is not None:
            self._restored = True
            self._mode = mode
        if self._run is not None:  # after setup (restore_checkpoint_after_setup): the loader is built after this
            self._run.claiming.resume = self._checkpointing.pool_position
        return checkpoint


AsyncPSStrategy.register_strategies(StrategyRegistry)
