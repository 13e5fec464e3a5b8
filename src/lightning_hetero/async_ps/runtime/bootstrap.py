"""Starting a fitting run: the checks of the Trainer, the model's flat parameters, rank 0's key-value store, the run's
context (:func:`build_context`) and its collaborators (:func:`start_run`), by ``AsyncPSStrategy.setup``; the parameter
server with its receiving threads and the client (:func:`start_servers`), by the ASP engine the first time the run
trains in ASP. Each step is a function.

Example::

    >>> import torch
    >>> check_optimizers([torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)] * 2)
    Traceback (most recent call last):
    ...
    ValueError: AsyncPSStrategy supports exactly one optimizer; configure_optimizers returned 2.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.optim import Optimizer

from lightning_hetero._lightning_internals import forget_train_dataloader, launched_processes, sync_module_states
from lightning_hetero.asp.client import AsynchronousClient
from lightning_hetero.asp.faults import FaultBoard, Membership
from lightning_hetero.asp.layout import FlatModel, flatten_model
from lightning_hetero.asp.placement import check_server_placement
from lightning_hetero.asp.protocol import SERVER_RANK, PeerLostError
from lightning_hetero.asp.server import ParameterServer
from lightning_hetero.asp.server_loop import ServerLoop
from lightning_hetero.asp.shard_hosting import ShardHosting
from lightning_hetero.asp.sharding import Shard, check_server_shards, plan_shards
from lightning_hetero.async_ps.runtime.claiming import DataClaiming
from lightning_hetero.async_ps.runtime.collectives import CollectiveGate
from lightning_hetero.async_ps.runtime.context import PSContext
from lightning_hetero.async_ps.runtime.fault_tolerance import FaultTolerance
from lightning_hetero.async_ps.runtime.stopping import AgreedStop, install
from lightning_hetero.async_ps.runtime.validation_points import ValidateTogether
from lightning_hetero.async_ps.runtime.validation_points import install as install_validation

if TYPE_CHECKING:
    from lightning_hetero.asp.compensation import AsynchronyCompensator
    from lightning_hetero.async_ps.interfaces import Engine
    from lightning_hetero.async_ps.runtime.context import BatchWeighting, StepCounter
    from lightning_hetero.async_ps.runtime.reporting import EpochLog
    from lightning_hetero.async_ps.runtime.trainer_limits import TrainerLimits
    from lightning_hetero.async_ps.settings import PSSettings
    from lightning_hetero.lr_schedules import CountedLRSchedulers

# The server's threads block in receives for as long as their worker is alive (it may validate, or the strategy may
# train synchronously for many epochs); a dead worker breaks the connection at once, so no timeout is needed there.
SERVER_RECEIVE_TIMEOUT = timedelta(days=7)


def check_optimizers(optimizers: Sequence[Optimizer]) -> None:
    """Fail unless ``configure_optimizers`` returned exactly one optimizer (the server applies one)."""
    if len(optimizers) != 1:
        raise ValueError(
            f"AsyncPSStrategy supports exactly one optimizer; configure_optimizers returned {len(optimizers)}."
        )


def startup_error(err: RuntimeError, ranks: int, startup_timeout_s: float) -> RuntimeError:
    """The error for ranks that did not all join the process group within ``startup_timeout_s`` (``err``: torch's)."""
    return RuntimeError(
        f"AsyncPSStrategy: the {ranks} ranks did not all join within startup_timeout_s={startup_timeout_s:g} "
        f"({str(err).splitlines()[0]}); start every rank, or raise startup_timeout_s on a busy machine."
    )


def check_sigterm(lock_step: bool, trainer: pl.Trainer | None, synchronous_check: Callable[[], None]) -> None:
    """Lightning's SIGTERM check before a training batch: its broadcast from rank 0 while the ranks train in
    lock-step, else this rank's own flag."""
    if lock_step:
        synchronous_check()
    elif trainer is not None and trainer.received_sigterm:
        raise SIGTERMException()


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
        shard: the shard (see :func:`~lightning_hetero.asp.sharding.plan_shards`).
        kwargs: :class:`~lightning_hetero.asp.server.ParameterServer`'s other arguments (``world_size`` and on).

    Example::

        >>> import torch
        >>> from lightning_hetero.asp.sharding import plan_shards
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
        max_staleness: see :class:`~lightning_hetero.asp.staleness.StalenessGate`.
        lr_scaling: see :func:`~lightning_hetero.asp.staleness.staleness_lr_factor`.
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
    server.max_updates = max_updates
    server.on_update = on_update
    server.tolerate_lost_workers = tolerate_lost_workers
    server.on_lost = on_lost
    workers = [worker for worker in range(world_size) if worker != rank]
    hosts = range(len(shards)) if shards is not None else ()
    loop = ServerLoop(server, workers, group, timedelta(seconds=timeout_s), shard_hosts=hosts)
    loop.start()
    return server, loop


def build_context(
    settings: PSSettings,
    trainer: pl.Trainer,
    optimizer: Optimizer,
    precision_plugin: Any,
    root_device: torch.device,
    rank: int,
    world_size: int,
    main_address: str,
    broadcast: Callable[[Any, int], Any],
    counter: StepCounter,
    weighting: BatchWeighting,
    schedules: CountedLRSchedulers,
    log: EpochLog,
    limits: TrainerLimits | None = None,
) -> tuple[PSContext, dist.ProcessGroup]:
    """When fitting, on every rank: lay the model out flat, connect to rank 0's store, plan the server's shards and
    meet the other ranks' membership; returns the run's context and the server's gloo group.

    Args:
        settings: the strategy's settings.
        trainer: the Trainer (its module is the model).
        optimizer: the user's optimizer.
        precision_plugin: the strategy's precision plugin.
        root_device: this rank's device.
        rank: this global rank.
        world_size: the number of ranks.
        main_address: rank 0's address (its store).
        broadcast: an object broadcast over every rank, ``broadcast(obj, src)``.
        counter: the model's version.
        weighting: this rank's batch share.
        schedules: step-interval LR schedulers counting server updates in ASP.
        log: per-step numbers logged as epoch statistics.
        limits: the Trainer's settings the strategy took over (``limit_train_batches``, applied to the epoch's claim
            pool; ``val_check_interval`` inside an epoch); ``None``: none.
    """
    module = trainer.lightning_module
    model = flatten_model(module)
    sync_module_states(module)
    group = dist.new_group(backend="gloo", timeout=SERVER_RECEIVE_TIMEOUT)
    store = connect_store(main_address, rank, settings.fault_timeout_s, broadcast)
    server_shards = settings.advanced.server_shards
    check_server_shards(server_shards, world_size)
    check_server_placement(settings.advanced.server_placement, world_size=world_size)
    shards = plan_shards(model.layout, server_shards) if server_shards > 1 else None
    if shards is not None:
        largest = max(shard.numel for shard in shards)
        if largest > 1.5 * model.flat.numel() / server_shards:
            rank_zero_warn(
                f"PSAdvanced(server_shards={server_shards}): the largest shard holds "
                f"{largest / model.flat.numel():.0%} of the parameters (a shard holds whole tensors), and the "
                "busiest shard bounds the server's speed; a model in more, smaller tensors balances better."
            )
    index_of = {id(p): i for i, p in enumerate(model.params)}
    group_indices = [[index_of.get(id(p), -1) for p in g["params"]] for g in optimizer.param_groups]
    membership = Membership(FaultBoard(store), rank, world_size, settings.fault_timeout_s)
    ctx = PSContext(
        settings=settings,
        trainer=trainer,
        module=module,
        optimizer=optimizer,
        precision_plugin=precision_plugin,
        root_device=root_device,
        rank=rank,
        world_size=world_size,
        flat=model,
        store=store,
        membership=membership,
        servers=ShardHosting(rank, shards, group_indices, settings.fault_timeout_s),
        counter=counter,
        weighting=weighting,
        schedules=schedules,
        log=log,
        train_limit=limits.limit if limits is not None else 1.0,
        val_points=limits.points if limits is not None else None,
    )
    return ctx, group


def start_servers(
    ctx: PSContext, group: dist.ProcessGroup, fault: FaultTolerance, compensator: AsynchronyCompensator | None
) -> None:
    """Start the server (shard) this rank hosts, if any, and this rank's client of all of them (in ``ctx.servers``).

    Args:
        ctx: the run's context.
        group: the server's gloo group.
        fault: the fault tolerance (told of lost ranks; names the rank lost first).
        compensator: the server's asynchrony compensation, or ``None``.
    """
    settings, servers = ctx.settings, ctx.servers
    if ctx.rank < settings.advanced.server_shards:
        server, loop = start_server(
            ctx.flat,
            ctx.optimizer,
            group,
            world_size=ctx.world_size,
            timeout_s=settings.fault_timeout_s,
            max_staleness=settings.max_staleness,
            lr_scaling=settings.advanced.lr_scaling,
            compensator=compensator,
            max_updates=ctx.trainer.max_steps,
            on_update=ctx.schedules.step_at,
            on_lost=fault.on_rank_lost,
            tolerate_lost_workers=fault.tolerates_lost_workers,
            rank=ctx.rank,
            shards=servers.shards,
        )
        servers.host(server, loop)
    servers.client = AsynchronousClient(
        ctx.flat.flat,
        ctx.rank,
        servers.hosted,
        group,
        settings.fault_timeout_s,
        lost_cause=fault.lost_cause,
        recorded_fault=fault.recorded_fault,
        pin_memory=ctx.root_device.type == "cuda",
        overlap=settings.advanced.overlap_round_trip,
        shards=servers.shards,
    )


@dataclass
class Run:
    """A fitting run: its context and the collaborators built on it, which the strategy's hooks call.

    Args:
        ctx: the run's shared context.
        fault: the fault tolerance.
        gate: the collective gating.
        claiming: the training loader's claim sampler.
    """

    ctx: PSContext
    fault: FaultTolerance
    gate: CollectiveGate
    claiming: DataClaiming


def start_run(
    ctx: PSContext,
    group: dist.ProcessGroup,
    engines: Iterable[Engine],
    engine: Callable[[], Engine],
    launcher: Any,
    compensator: Callable[[], AsynchronyCompensator | None],
    ddp: Any,
) -> Run:
    """Build the collaborators on ``ctx`` (stops agreed among the ranks: :mod:`~lightning_hetero.async_ps.runtime.stopping`),
    hand all to the engines, and leave the servers for the ASP engine to start (``ctx.servers.start()``).

    Args:
        ctx: the run's context (:func:`build_context`).
        group: the server's gloo group.
        engines: every engine of the strategy.
        engine: the engine in force when asked.
        launcher: Lightning's launcher (the processes it started).
        compensator: makes the server's asynchrony compensation (``None``: none), when ASP first starts.
        ddp: the parent ``DDPStrategy`` (``super()``), whose ``reduce`` and ``broadcast`` are the ungated collectives.
    """
    fault = FaultTolerance(ctx, engine, launcher, list(launched_processes(launcher) or []))
    ctx.servers.starter = lambda: start_servers(ctx, group, fault, compensator())
    gate = CollectiveGate(ctx, fault, engine, ddp.reduce, ddp.broadcast)
    for each in engines:
        each.setup(ctx, fault, gate)
    stop = AgreedStop(ctx, fault, engine)
    ctx.counter.ceiling = stop.shown_step
    install(ctx.trainer, stop)
    points = (
        ValidateTogether(lambda: ctx.claim_sampler, ctx.world_size, engine, ctx.val_points)
        if ctx.val_points is not None
        else None
    )
    install_validation(ctx.trainer, points)
    forget_train_dataloader(ctx.trainer)  # one loaded for `estimated_stepping_batches` lacks the claim sampler
    return Run(ctx, fault, gate, DataClaiming(ctx, fault, engine))
