"""Synchronous training (BSP) and the switches between modes.

In BSP every rank all-reduces its batch-weighted gradient (:mod:`lightning_hetero.batch_weighting`) and steps its own
copy of the optimizer, as DDP does. :meth:`ModeSwitching.set_mode` switches at an epoch's end, in process: entering
BSP gives every rank the server's parameters, optimizer state and version (gathered from the shards with
``server_shards > 1``); entering ASP loads rank 0's into the server (each shard's host its cut).

A mixin of :class:`~lightning_hetero.ps.strategy.AsyncPSStrategy` (it moves the strategy's optimizer, schedulers and
step counter, and broadcasts with Lightning's collectives).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightning.pytorch.strategies import DDPStrategy
from torch.optim import Optimizer

from lightning_hetero._lightning_internals import optimizers_to_device, sync_module_states
from lightning_hetero.batch_weighting import gradient_weight
from lightning_hetero.contracts import Mode, check_mode
from lightning_hetero.param_groups import hyperparameters
from lightning_hetero.ps.layout import flatten_grads_into
from lightning_hetero.ps.protocol import SERVER_RANK, all_reduce_weighted

if TYPE_CHECKING:
    import lightning.pytorch as pl
    import torch

    from lightning_hetero.lr_schedules import CountedLRSchedulers
    from lightning_hetero.ps.bootstrap import FlatModel
    from lightning_hetero.ps.server import ParameterServer


class ModeSwitching:
    """BSP steps and mode switches (see the module's docstring). Also uses the strategy's ``_meet``,
    ``_check_no_rank_lost``, ``_tolerates_lost_workers`` and ``_collective`` (fault tolerance), ``_average_buffers``
    (collective gating), ``_share``, ``_mark_compute_end``, ``_set_step_counter``, ``_take_over_step_schedules`` and
    ``_announce_compensation``."""

    # provided by AsyncPSStrategy
    version: int
    global_rank: int
    optimizers: list[Optimizer]
    root_device: torch.device
    lightning_module: Any
    precision_plugin: Any
    last_switch_s: float | None
    _mode: Mode
    _active: bool
    _joined: bool
    _server: ParameterServer | None
    _flat_model: FlatModel | None
    _attached_trainer: pl.Trainer | None
    _step_schedules: CountedLRSchedulers
    _server_state: Callable[[], dict[str, Any]]  # ShardHosting
    _load_hosted: Callable[[dict[str, Any] | None, int], None]  # ShardHosting

    def set_mode(self, mode: Mode) -> None:
        """Switch between ``"asp"``, ``"bsp"`` and ``"local"``; call on every rank with the same value at an epoch's end (e.g. from
        ``on_train_epoch_end``). Takes effect for the next epoch without restarting processes. Entering BSP gives
        every rank the server's parameters, optimizer state and version; entering ASP loads rank 0's into the server;
        entering local SGD from ASP is as entering BSP, and leaving it gives every rank rank 0's inner optimizer
        state (see :mod:`~lightning_hetero.ps.local_mode`). The time taken is kept in :attr:`last_switch_s`.

        Args:
            mode: ``"asp"``, ``"bsp"`` or ``"local"``.
        """
        check_mode(mode)
        if mode == self._mode:
            return
        if not self._active:
            self._mode = mode
            return
        start = time.perf_counter()
        previous = self._mode
        if previous == "local":
            self._leave_local()
        if mode in ("bsp", "local"):
            self._meet()  # brings every rank's view of the lost ranks up to date
            self._check_no_rank_lost("switch to BSP" if mode == "bsp" else "switch to local SGD")
            if previous == "asp":  # the ranks take the server's state (after BSP or local SGD they agree already)
                self._enter_bsp()
        else:
            self._enter_asp()
        if mode == "local":
            self._enter_local()
        self._mode = mode
        if self._server is not None:  # elastic ASP is unsharded: rank 0's server is the only one
            self._server.tolerate_lost_workers = self._tolerates_lost_workers()
        self.last_switch_s = time.perf_counter() - start

    def _synchronous_step(self, optimizer: Optimizer, closure: Callable[[], Any], model: Any, **kwargs: Any) -> Any:
        """One BSP step: the closure (forward, backward), then the batch-weighted all-reduce, then the optimizer."""

        def synchronised_closure() -> Any:
            result = closure()
            self._mark_compute_end()
            self._all_reduce_gradients()
            return result

        output = self.precision_plugin.optimizer_step(optimizer, model=model, closure=synchronised_closure, **kwargs)
        self.version += 1
        return output

    def _all_reduce_gradients(self) -> None:
        assert self._flat_model is not None
        params, grad_flat = self._flat_model.params, self._flat_model.grad_flat
        flatten_grads_into(params, grad_flat)
        weight = gradient_weight(self._share())
        self._collective(lambda: all_reduce_weighted(grad_flat, weight))
        for param, grad in zip(params, self._flat_model.layout.views(grad_flat), strict=True):
            if param.grad is None:
                param.grad = grad.clone()
            else:
                param.grad.copy_(grad)

    def _enter_bsp(self) -> None:
        self._average_buffers()
        self._step_schedules.release()
        optimizer = self.optimizers[0]
        trainer = self._attached_trainer
        assert trainer is not None and self._flat_model is not None
        schedulers = [config.scheduler for config in trainer.lr_scheduler_configs]
        if self._server is not None:
            state = self._server_state()
            self._flat_model.flat.copy_(state["params"])
            # the server's hyper-parameters date from its last update; rank 0's are the schedules' current ones
            current = [hyperparameters(group) for group in optimizer.param_groups]
            payload_obj = (state["optimizer"], state["version"], current, [s.state_dict() for s in schedulers])
        else:
            payload_obj = None
        optimizer_state, version, current, scheduler_states = self._broadcast_unguarded(payload_obj, SERVER_RANK)
        optimizer.load_state_dict(copy.deepcopy(optimizer_state))
        for group, hyper in zip(optimizer.param_groups, current, strict=True):
            group.update(hyper)
        if self.global_rank != SERVER_RANK:  # schedulers counted server updates on rank 0 only
            for scheduler, scheduler_state in zip(schedulers, scheduler_states, strict=True):
                scheduler.load_state_dict(scheduler_state)
        optimizers_to_device(self.optimizers, self.root_device)
        sync_module_states(self.lightning_module)
        self.version = version
        self._set_step_counter(version, in_step=False)

    def _enter_asp(self) -> None:
        self._joined = False
        self._take_over_step_schedules()
        self._load_hosted(copy.deepcopy(self.optimizers[0].state_dict()), self.version)
        self._announce_compensation()
        self._meet()

    def _broadcast_unguarded(self, obj: Any, src: int) -> Any:
        """Lightning's broadcast on the default group, without the strategy's gating (every rank is here)."""
        return DDPStrategy.broadcast(self, obj, src=src)
