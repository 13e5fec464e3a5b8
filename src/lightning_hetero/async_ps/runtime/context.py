"""What ``AsyncPSStrategy``'s engines and collaborators share, passed to each explicitly: the model's version (:class:`StepCounter`), the gradient weighting
attached by ``HeteroBatchCallback`` (:class:`BatchWeighting`) and, once training starts, the :class:`PSContext`
built at setup (the flat model, rank 0's store, the membership, the servers, the claim sampler).

Example::

    >>> weighting = BatchWeighting(world_size=lambda: 4)
    >>> weighting.share()
    0.25
    >>> weighting.attach(compute_timer=None, batch_share=lambda: 0.5)
    >>> weighting.share()
    0.5
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lightning_hetero._lightning_internals import set_global_step
from lightning_hetero.batch_weighting import equal_share

if TYPE_CHECKING:
    import lightning.pytorch as pl
    import torch
    import torch.distributed as dist
    from torch.optim import Optimizer

    from lightning_hetero.asp.faults import Membership
    from lightning_hetero.asp.layout import FlatModel
    from lightning_hetero.asp.shard_hosting import ShardHosting
    from lightning_hetero.async_ps.runtime.reporting import EpochLog
    from lightning_hetero.async_ps.runtime.sampler import ClaimSampler
    from lightning_hetero.async_ps.runtime.validation_points import ValidationPoints
    from lightning_hetero.async_ps.settings import PSSettings
    from lightning_hetero.contracts import ComputeEndMark
    from lightning_hetero.lr_schedules import CountedLRSchedulers


class StepCounter:
    """The number of updates the model received (the server's version in ASP, the step count in BSP and local SGD),
    mirrored into ``trainer.global_step`` once a trainer is attached."""

    def __init__(self) -> None:
        self.version = 0
        self.trainer: pl.Trainer | None = None
        #: ``ceiling(version, in_step)``: the step count shown to Lightning (see :mod:`~lightning_hetero.async_ps.runtime.stopping`)
        self.ceiling: Callable[[int, bool], int] | None = None

    def set(self, version: int, in_step: bool) -> None:
        """Make ``version`` the model's and ``trainer.global_step``'s (the loop adds one after a step: ``in_step``)."""
        self.version = version
        assert self.trainer is not None
        shown = version if self.ceiling is None else self.ceiling(version, in_step)
        set_global_step(self.trainer, shown, in_step)


class BatchWeighting:
    """This rank's batch share and compute-end mark, as ``HeteroBatchCallback`` attaches them (equal shares and no
    mark without it).

    Args:
        world_size: the number of ranks (read when a share is asked).
    """

    def __init__(self, world_size: Callable[[], int]) -> None:
        self._world_size = world_size
        self.compute_timer: ComputeEndMark | None = None
        self.batch_share: Callable[[], float] | None = None

    def attach(self, compute_timer: ComputeEndMark | None, batch_share: Callable[[], float]) -> None:
        self.compute_timer = compute_timer
        self.batch_share = batch_share

    def share(self) -> float:
        """This rank's ``b_k / sum(b)`` for the current step."""
        return float(self.batch_share()) if self.batch_share is not None else equal_share(self._world_size())

    def loss_weight(self) -> float:
        """What this rank back-propagates from its loss where DDP's reducer averages: ``N x share``, exactly 1 for
        an equal share."""
        weight = self._world_size() * self.share()
        return 1.0 if abs(weight - 1.0) < 1e-12 else weight

    def mark_compute_end(self) -> None:
        """Local gradients are ready (before any communication)."""
        if self.compute_timer is not None:
            self.compute_timer.mark_compute_end()


@dataclass
class PSContext:
    """What a fitting run shares, built once at setup by :func:`~lightning_hetero.async_ps.runtime.bootstrap.build_context`.

    Args:
        settings: the strategy's settings.
        trainer: the Trainer.
        module: the LightningModule.
        optimizer: the user's optimizer (the only one).
        precision_plugin: the strategy's precision plugin (steps the optimizer).
        root_device: this rank's device.
        rank: this global rank.
        world_size: the number of ranks.
        flat: the model's trainable parameters as one flat buffer.
        store: rank 0's key-value store (claims, faults, meetings).
        membership: the ranks still training and their meetings.
        servers: the parameter server (shards) this rank hosts and its client.
        counter: the model's version.
        weighting: this rank's batch share.
        schedules: step-interval LR schedulers counting server updates in ASP.
        log: per-step numbers logged as epoch statistics.
        claim_sampler: the training loader's claim sampler, once the loader is built (``None`` for a custom one).
        train_limit: ``limit_train_batches`` (a fraction of the epoch's batches, or batches per rank): the claim pool's
            size (:func:`~lightning_hetero.async_ps.runtime.trainer_limits.pool_chunks`).
        val_points: ``val_check_interval`` inside an epoch as points of the claim pool
            (:mod:`~lightning_hetero.async_ps.runtime.validation_points`); ``None``: validation at epoch ends (or BSP alone).
        active: fitting and not failed or ended.
    """

    settings: PSSettings
    trainer: pl.Trainer
    module: pl.LightningModule
    optimizer: Optimizer
    precision_plugin: Any
    root_device: torch.device
    rank: int
    world_size: int
    flat: FlatModel
    store: dist.Store
    membership: Membership
    servers: ShardHosting
    counter: StepCounter
    weighting: BatchWeighting
    schedules: CountedLRSchedulers
    log: EpochLog
    claim_sampler: ClaimSampler | None = field(default=None)
    train_limit: float | int = 1.0
    val_points: ValidationPoints | None = None
    active: bool = True

    def float_buffers(self) -> list[torch.Tensor]:
        """The module's floating-point buffers (BatchNorm running statistics)."""
        return [b for b in self.module.buffers() if b.is_floating_point()]
