"""Data claiming: the training loader's sampler becomes a :class:`~lightning_hetero.async_ps.runtime.sampler.ClaimSampler`, whose
ranks claim the epoch's chunks from a shared counter in rank 0's store, so that in ASP faster workers take more
batches and the epoch still covers the data once.

Example::

    >>> from torch.utils.data import DataLoader, RandomSampler
    >>> loader = DataLoader(list(range(10)), batch_size=2, shuffle=True)
    >>> sampler_order(loader.sampler)
    (True, 0)
    >>> sampler_order(DataLoader(list(range(10)), sampler=[3, 1]).sampler) is None  # a custom sampler decides
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch.distributed as dist
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from lightning_hetero._lightning_internals import uses_distributed_sampler, with_sampler
from lightning_hetero.asp.placement import reserved_only
from lightning_hetero.asp.protocol import SERVER_RANK
from lightning_hetero.async_ps.runtime.sampler import ClaimSampler
from lightning_hetero.async_ps.runtime.trainer_limits import lock_step_interval, mode_switcher, pool_chunks
from lightning_hetero.async_ps.runtime.validation_points import refuse_without_claims
from lightning_hetero.epoch_order import sampler_order

if TYPE_CHECKING:
    from lightning_hetero.async_ps.interfaces import ModeFlags
    from lightning_hetero.async_ps.runtime.context import PSContext
    from lightning_hetero.async_ps.runtime.fault_tolerance import FaultTolerance


class StoreClaims:
    """The epoch's shared claim counters in rank 0's store: ``claim(epoch, count, segment=0)`` reserves ``count``
    positions of the epoch's (segment's) claims and returns the first one.

    Args:
        store: rank 0's key-value store.
        lost_cause: maps a failed store operation to the error to raise (rank 0 is gone).
    """

    def __init__(self, store: dist.Store, lost_cause: Callable[[BaseException], BaseException]) -> None:
        self._store = store
        self._lost_cause = lost_cause

    def __call__(self, epoch: int, count: int, segment: int = 0) -> int:
        key = f"claims/epoch{epoch}" + (f"/segment{segment}" if segment else "")
        try:
            return self._store.add(key, count) - count
        except RuntimeError as err:
            raise self._lost_cause(err) from err


def claiming_loader(
    dataloader: DataLoader,
    claims: Callable[[int, int], int],
    epoch: Callable[[], int],
    asynchronous: Callable[[], bool],
    rank: int,
    world_size: int,
    tail: Callable[[int, set[int]], list[int]] | None,
    reserved_only: Callable[[], bool] = lambda: False,
    limit: float | int = 1.0,
) -> tuple[DataLoader, ClaimSampler] | None:
    """A copy of the training ``dataloader`` with a :class:`ClaimSampler` in place of its sampler, and the sampler;
    ``None`` when the loader is left alone (no batch size, or a custom sampler).

    Args:
        dataloader: the training loader.
        claims: reserves chunks of an epoch (see :class:`StoreClaims`).
        epoch: the current epoch.
        asynchronous: whether ranks claim now (ASP) rather than take fixed shares (BSP).
        rank: this global rank.
        world_size: the number of ranks.
        tail: rank 0's source of lost workers' chunks in elastic ASP, else ``None``.
        reserved_only: whether this rank trains only its reserved first chunk now (a dedicated server rank in ASP).
        limit: ``limit_train_batches``: the epoch's pool holds a fraction of the batches, or so many per rank.
    """
    order = sampler_order(dataloader.sampler)
    if dataloader.batch_size is None or order is None:
        return None
    shuffle, seed = order
    chunks = -(-len(dataloader.dataset) // dataloader.batch_size)  # type: ignore[arg-type]
    sampler = ClaimSampler(
        len(dataloader.dataset),
        dataloader.batch_size,
        claims,
        epoch=epoch,
        asynchronous=asynchronous,
        rank=rank,
        world_size=world_size,
        shuffle=shuffle,
        seed=seed,
        tail=tail,
        reserved_only=reserved_only,
        pool_chunks=pool_chunks(chunks, limit, world_size),
    )
    return with_sampler(dataloader, sampler), sampler


def thread_safe_workers(loader: DataLoader) -> bool:
    """Make the loader start its worker processes from a fork server rather than by forking this process, whose
    threads (the parameter server's in ASP, the claims' store, Lightning's progress bar) make a forked worker crash at
    random ("DataLoader worker exited unexpectedly", a segmentation fault, seen in every mode); ``True`` when changed
    (worker processes and no start method of the user's own).

    Example::

        >>> loader = DataLoader(list(range(4)), batch_size=2, num_workers=1)
        >>> thread_safe_workers(loader), loader.multiprocessing_context.get_start_method()
        (True, 'forkserver')
        >>> thread_safe_workers(DataLoader(list(range(4)), batch_size=2))  # no worker processes
        False
    """
    if loader.num_workers == 0 or loader.multiprocessing_context is not None:
        return False
    loader.multiprocessing_context = "forkserver"
    return True


class DataClaiming:
    """The training loader's claim sampler (the strategy's ``process_dataloader`` hook hands each loader it gets
    from Lightning to :meth:`process`).

    Args:
        ctx: the run's shared context (its store; the claim sampler is kept in it).
        fault: the fault tolerance (the cause of a failed claim; lost workers' chunks in elastic ASP).
        mode: the mode in force (ranks claim chunks unless it trains in lock-step).
    """

    def __init__(self, ctx: PSContext, fault: FaultTolerance, mode: Callable[[], ModeFlags]) -> None:
        self.ctx = ctx
        self.fault = fault
        self._mode = mode
        #: a restored checkpoint's position in its epoch's claim pool (:meth:`ClaimSampler.position`), handed to the
        #: next claim sampler built
        self.resume: dict[str, int] | None = None

    def position(self) -> dict[str, int] | None:
        """The claim pool's position to checkpoint: while validating at a point inside an epoch, where the epoch's
        next segment starts (every rank has trained the chunks before it); ``None`` elsewhere."""
        sampler = self.ctx.claim_sampler
        if sampler is None or not self.ctx.active or not self.ctx.trainer.validating:
            return None
        return sampler.position()

    def process(self, dataloader: object) -> object:
        """Give the training loader a :class:`~lightning_hetero.async_ps.runtime.sampler.ClaimSampler` (in place of Lightning's
        ``DistributedSampler``), so that in ASP faster workers take more batches and the epoch still covers the data
        once. Loaders with a custom sampler or batch sampler are left alone."""
        ctx = self.ctx
        trainer = ctx.trainer
        if ctx.active and isinstance(dataloader, DataLoader) and thread_safe_workers(dataloader):
            rank_zero_info(
                "lightning-hetero: a loader's worker processes start from a fork server "
                "(multiprocessing_context='forkserver'): forked beside the strategy's threads they can crash"
            )
        if (
            not ctx.active
            or trainer.state.fn != TrainerFn.FITTING
            or trainer.state.stage != RunningStage.TRAINING
            or not uses_distributed_sampler(trainer)
            or not isinstance(dataloader, DataLoader)
        ):
            return dataloader
        elastic = ctx.rank == SERVER_RANK and ctx.settings.on_worker_lost == "continue"  # rank 0 hosts the server
        tail = "on_worker_lost='continue' trains a lost worker's batches at the epoch's end, after the points"
        refuse_without_claims(ctx.val_points, tail if ctx.settings.on_worker_lost == "continue" else None)
        claiming = claiming_loader(
            dataloader,
            StoreClaims(ctx.store, self.fault.lost_cause),
            epoch=lambda: trainer.current_epoch,
            asynchronous=lambda: not self._mode().lock_step,
            rank=ctx.rank,
            world_size=ctx.world_size,
            tail=self.fault.lost_workers_chunks if elastic else None,
            reserved_only=lambda: reserved_only(
                ctx.settings.advanced.server_placement, self._mode().through_server, ctx.rank
            ),
            limit=ctx.train_limit,
        )
        if claiming is None:  # a loader of its own (HeteroBatch's, a custom sampler): Lightning's limit applies
            refuse_without_claims(ctx.val_points, "the training loader has a sampler of its own (not claimed)")
            trainer.limit_train_batches = ctx.train_limit
            return dataloader
        loader, ctx.claim_sampler = claiming  # a copy of the loader: its start method is the one set above
        ctx.claim_sampler.resume_from(self.resume)
        self.resume = None
        points = ctx.val_points
        if points is not None:  # the pool is cut at the validation points (every rank alike)
            pool = -(-ctx.claim_sampler.epoch_samples // loader.batch_size)
            ctx.claim_sampler.segments = lambda epoch: points.plan(epoch, pool, ctx.world_size)[0]
        if self._mode().lock_step and mode_switcher(trainer) is None:  # BSP alone validates inside an epoch
            lock_step_interval(trainer, -(-ctx.claim_sampler.epoch_samples // loader.batch_size // ctx.world_size))
        return loader
