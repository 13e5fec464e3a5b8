"""Starting asynchronous training: the checks of the Trainer, the model's flat parameters, rank 0's key-value store,
and the parameter server with its receiving threads. Called once by ``AsyncPSStrategy.setup`` when fitting; each
step is a function.

Example::

    >>> import torch
    >>> model = torch.nn.Linear(2, 1)
    >>> flat = flatten_model(model)
    >>> flat.layout.names, flat.flat.numel(), model.weight.data_ptr() == flat.flat.data_ptr()
    (('weight', 'bias'), 3, True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.optim import Optimizer
from typing_extensions import override

from lightning_hetero._lightning_internals import (
    launched_processes,
    optimizers_to_device,
    replace_sigterm_broadcast,
    set_default_group_timeout,
    sync_module_states,
    validates_on_time_interval,
)
from lightning_hetero.lr_schedules import CountedLRSchedulers
from lightning_hetero.ps.asp_client import AsynchronousClient
from lightning_hetero.ps.compensation import AsynchronyCompensator, unsupported_reason
from lightning_hetero.ps.faults import FaultBoard, Membership
from lightning_hetero.ps.layout import FlatLayout, bind_parameters_to_flat
from lightning_hetero.ps.placement import check_server_placement
from lightning_hetero.ps.protocol import SERVER_RANK, PeerLostError
from lightning_hetero.ps.server import ParameterServer, ServerLoop
from lightning_hetero.ps.sharding import Shard, check_server_shards, plan_shards

# The server's threads block in receives for as long as their worker is alive (it may validate, or the strategy may
# train synchronously for many epochs); a dead worker breaks the connection at once, so no timeout is needed there.
SERVER_RECEIVE_TIMEOUT = timedelta(days=7)


@dataclass
class FlatModel:
    """A model's trainable parameters bound to one flat buffer (see :func:`flatten_model`).

    Args:
        layout: names, shapes and offsets of the parameters.
        params: the parameters, in layout order (views of ``flat``).
        flat: the flat parameters.
        grad_flat: a buffer of ``flat``'s size for the flat gradient.
    """

    layout: FlatLayout
    params: list[torch.Tensor]
    flat: torch.Tensor
    grad_flat: torch.Tensor


def check_trainer(module: pl.LightningModule, trainer: pl.Trainer) -> None:
    """Fail early, naming the setting, for what the strategy does not support: manual optimization, and validation
    inside an epoch (ranks run different numbers of batches in ASP).
    """
    if not module.automatic_optimization:
        raise ValueError(
            "AsyncPSStrategy supports automatic optimization only; the parameter server applies the optimizer. "
            "Remove `self.automatic_optimization = False`."
        )
    # a duration leaves no `trainer.val_check_interval` at all: test it first
    if validates_on_time_interval(trainer) or isinstance(trainer.val_check_interval, int):
        got = "a duration" if validates_on_time_interval(trainer) else repr(trainer.val_check_interval)
        raise ValueError(
            "AsyncPSStrategy validates at epoch ends only (ranks run different numbers of batches in ASP); "
            f"got val_check_interval={got}."
        )


def flatten_model(module: torch.nn.Module) -> FlatModel:
    """Lay out ``module``'s trainable parameters in one flat buffer and make them views of it.

    Raises:
        ValueError: the model has no trainable parameters, or they span several devices or dtypes.
    """
    named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    if not named:
        raise ValueError("AsyncPSStrategy: the model has no trainable parameters.")
    kinds = {(p.device, p.dtype) for _, p in named}
    if len(kinds) != 1 or not named[0][1].is_floating_point():
        raise ValueError(
            "AsyncPSStrategy needs all trainable parameters on one device with one floating dtype to lay them "
            f"out in a flat buffer; found {sorted(str(k) for k in kinds)}."
        )
    layout = FlatLayout.from_named_parameters(named)
    params = [p for _, p in named]
    flat = torch.empty(layout.numel, dtype=params[0].dtype, device=params[0].device)
    bind_parameters_to_flat(params, flat)
    return FlatModel(layout, params, flat, torch.empty_like(flat))


def connect_store(host: str, rank: int, timeout_s: float, broadcast: Callable[[Any, int], Any]) -> dist.Store:
    """A key-value store hosted by rank 0 (the epoch's shared claim counters, faults and meetings).

    Args:
        host: rank 0's address.
        rank: this global rank.
        timeout_s: how long a store operation may wait.
        broadcast: the strategy's object broadcast, ``broadcast(obj, src)`` (sends rank 0's port to the others).
    """
    timeout = timedelta(seconds=timeout_s)
    if rank == SERVER_RANK:
        store = dist.TCPStore(host, 0, None, True, timeout=timeout, wait_for_workers=False)
        port = store.port
    else:
        port = None
    port = broadcast(port, SERVER_RANK)
    if rank != SERVER_RANK:
        store = dist.TCPStore(host, port, None, False, timeout=timeout)
    return store


def shard_server(model: FlatModel, optimizer: Optimizer, shard: Shard, **kwargs: Any) -> ParameterServer:
    """A parameter server over ``shard``'s parameters of ``model`` (all of them for a shard of the whole model).

    Args:
        model: the flat model (the server starts from its parameters).
        optimizer: the user's optimizer (the server applies a clone over the shard's parameters).
        shard: the shard (see :func:`~lightning_hetero.ps.sharding.plan_shards`).
        kwargs: :class:`~lightning_hetero.ps.server.ParameterServer`'s other arguments (``world_size`` and on).

    Example::

        >>> import torch
        >>> from lightning_hetero.ps.sharding import plan_shards
        >>> flat = flatten_model(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2)))
        >>> optimizer = torch.optim.SGD(flat.params, lr=0.1)
        >>> shard = plan_shards(flat.layout, 2)[1]
        >>> server = shard_server(flat, optimizer, shard, world_size=2)
        >>> server.layout.names, server.params.numel(), len(server.optimizer.param_groups[0]["params"])
        (('0.bias', '1.weight', '1.bias'), 8, 3)
    """
    mine = range(shard.first, shard.last)
    return ParameterServer(
        shard.layout(model.layout),
        model.flat[shard.start : shard.stop],
        optimizer,
        {id(model.params[i]): i - shard.first for i in mine},
        foreign={id(p) for i, p in enumerate(model.params) if i not in mine},
        **kwargs,
    )


def start_server(
    model: FlatModel,
    optimizer: Optimizer,
    group: dist.ProcessGroup,
    world_size: int,
    timeout_s: float,
    max_staleness: int | None,
    lr_scaling: str,
    compensator: AsynchronyCompensator | None,
    max_updates: int,
    on_update: Callable[[int], None],
    on_lost: Callable[[PeerLostError], None],
    tolerate_lost_workers: bool,
    rank: int = SERVER_RANK,
    shards: Sequence[Shard] | None = None,
) -> tuple[ParameterServer, ServerLoop]:
    """Rank 0 (with shards, rank ``s`` for shard ``s``): build the parameter server (shard) from the model and the
    user's optimizer and start one receiving thread per other worker.

    Args:
        model: the flat model (the server starts from its parameters).
        optimizer: the user's optimizer (the server applies a clone that follows its hyper-parameters).
        group: the server's gloo group.
        world_size: the number of workers.
        timeout_s: how long a reply may take to send (``fault_timeout_s``).
        max_staleness: see :class:`~lightning_hetero.ps.staleness.StalenessGate`.
        lr_scaling: see :func:`~lightning_hetero.ps.staleness.staleness_lr_factor`.
        compensator: the asynchrony compensation, or ``None``.
        max_updates: ``max_steps`` (-1: no bound).
        on_update: called with each new version (steps LR schedulers).
        on_lost: called with each lost rank's error.
        tolerate_lost_workers: go on without lost workers (elastic ASP).
        rank: this global rank.
        shards: the server's shards (``None``: one server); this rank hosts shard ``rank``.
    """
    shard = shards[rank] if shards is not None else Shard(0, 0, model.flat.numel(), 0, len(model.params))
    server = shard_server(
        model, optimizer, shard, world_size=world_size, max_staleness=max_staleness, lr_scaling=lr_scaling,
        compensator=compensator,
    )  # fmt: skip
    reason = unsupported_reason(optimizer) if compensator is not None else None
    if reason is not None:
        rank_zero_warn(f"AsyncPSStrategy(asynchrony_compensation={compensator.mode!r}): {reason}.")
    server.max_updates = max_updates
    server.on_update = on_update
    server.tolerate_lost_workers = tolerate_lost_workers
    server.on_lost = on_lost
    workers = [worker for worker in range(world_size) if worker != rank]
    hosts = range(len(shards)) if shards is not None else ()
    loop = ServerLoop(server, workers, group, timedelta(seconds=timeout_s), shard_hosts=hosts)
    loop.start()
    return server, loop


class ServerBootstrap:
    """The strategy's ``setup_distributed``, ``setup`` and ``teardown``: when fitting, checks the Trainer, flattens
    the model, connects to rank 0's store, starts the server (rank 0) and every rank's client, and makes Lightning's
    SIGTERM check local while asynchronous.

    A mixin of :class:`~lightning_hetero.ps.strategy.AsyncPSStrategy` (first in its bases: ``super()`` past this
    class reaches ``DDPStrategy``); uses the strategy's compensation (``_new_compensator``), schedules and fault
    tolerance (``_on_rank_lost``, ``_lost_cause``, ``_recorded_fault``, ``_tolerates_lost_workers``).
    """

    # provided by AsyncPSStrategy and DDPStrategy
    fault_timeout_s: float
    startup_timeout_s: float
    max_staleness: int | None
    lr_scaling: str
    _mode: str
    _active: bool
    _attached_trainer: pl.Trainer | None
    _flat_model: FlatModel | None
    _client: AsynchronousClient | None
    overlap_round_trip: bool
    server_shards: int
    server_placement: str
    _server: ParameterServer | None
    _loop: ServerLoop | None
    _shard_server: ParameterServer | None
    _shard_loop: ServerLoop | None
    _shards: list[Shard] | None
    _group_indices: list[list[int]]
    _store: dist.Store | None
    _membership: Membership | None
    _step_schedules: CountedLRSchedulers
    _launched: list[Any]
    _validation_members: list[int]

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
        set_default_group_timeout(timedelta(seconds=self.fault_timeout_s))

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None and self.model is not None
        self._attached_trainer = trainer
        self.accelerator.setup(trainer)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        fitting = trainer.state.fn == TrainerFn.FITTING
        if fitting:
            check_trainer(self.lightning_module, trainer)
            self.setup_optimizers(trainer)
            if len(self.optimizers) != 1:
                raise ValueError(
                    f"AsyncPSStrategy supports exactly one optimizer; configure_optimizers returned "
                    f"{len(self.optimizers)}."
                )
        self.setup_precision_plugin()
        if fitting:
            optimizers_to_device(self.optimizers, self.root_device)
            self._setup_server(trainer)
        else:
            sync_module_states(self.model)

    def _setup_server(self, trainer: pl.Trainer) -> None:
        module = self.lightning_module
        assert module is not None and self.cluster_environment is not None
        self._flat_model = model = flatten_model(module)
        sync_module_states(module)
        group = dist.new_group(backend="gloo", timeout=SERVER_RECEIVE_TIMEOUT)
        self._store = connect_store(
            self.cluster_environment.main_address, self.global_rank, self.fault_timeout_s, self.broadcast
        )
        check_server_shards(self.server_shards, self.world_size)
        check_server_placement(self.server_placement, world_size=self.world_size)
        self._shards = plan_shards(model.layout, self.server_shards) if self.server_shards > 1 else None
        if self._shards is not None:
            largest = max(shard.numel for shard in self._shards)
            if largest > 1.5 * model.flat.numel() / self.server_shards:
                rank_zero_warn(
                    f"AsyncPSStrategy(server_shards={self.server_shards}): the largest shard holds "
                    f"{largest / model.flat.numel():.0%} of the parameters (a shard holds whole tensors), and the "
                    "busiest shard bounds the server's speed; a model in more, smaller tensors balances better."
                )
        index_of = {id(p): i for i, p in enumerate(model.params)}
        self._group_indices = [[index_of.get(id(p), -1) for p in g["params"]] for g in self.optimizers[0].param_groups]
        if self.global_rank < self.server_shards:
            server, loop = start_server(
                model,
                self.optimizers[0],
                group,
                world_size=self.world_size,
                timeout_s=self.fault_timeout_s,
                max_staleness=self.max_staleness,
                lr_scaling=self.lr_scaling,
                compensator=self._new_compensator(),
                max_updates=trainer.max_steps,
                on_update=self._step_schedules.step_at,
                on_lost=self._on_rank_lost,
                tolerate_lost_workers=self._tolerates_lost_workers(),
                rank=self.global_rank,
                shards=self._shards,
            )
            if self.global_rank == SERVER_RANK:
                self._server, self._loop = server, loop
            else:
                self._shard_server, self._shard_loop = server, loop
        self._client = AsynchronousClient(
            model.flat,
            self.global_rank,
            self._server if self._server is not None else self._shard_server,
            group,
            self.fault_timeout_s,
            lost_cause=self._lost_cause,
            recorded_fault=self._recorded_fault,
            pin_memory=self.root_device.type == "cuda",
            overlap=self.overlap_round_trip,
            shards=self._shards,
        )
        self._launched = list(launched_processes(self.launcher) or [])
        self._validation_members = list(range(self.world_size))
        self._membership = Membership(FaultBoard(self._store), self.global_rank, self.world_size, self.fault_timeout_s)
        replace_sigterm_broadcast(trainer, self._sigterm_check)
        self._active = True

    def _sigterm_check(self, synchronous_check: Callable[[], None]) -> None:
        # Lightning broadcasts a SIGTERM flag from rank 0 before every training batch. In ASP ranks run different
        # numbers of batches, so that broadcast would pair unrelated batches and deadlock at the epoch's end; while
        # asynchronous, each rank checks its own flag instead.
        if self._mode == "bsp":
            synchronous_check()
        elif self._attached_trainer is not None and self._attached_trainer.received_sigterm:
            raise SIGTERMException()

    @override
    def teardown(self) -> None:
        self._active = False
        self._loop = None
        self._shard_loop = None
        self._store = None
        super().teardown()
