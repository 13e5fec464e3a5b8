"""The Trainer's settings under ``AsyncPSStrategy``: what is refused at setup (each message names the setting, the
reason and the alternative), how ``limit_train_batches`` becomes the size of the epoch's claim pool, and the step
estimate Lightning's ``trainer.estimated_stepping_batches`` reads (one update per claimed batch in ASP and local SGD,
one per rank's batch in BSP). See ``docs/async_ps.md`` (Limits).

Example::

    >>> pool_chunks(10, 1.0, world_size=2), pool_chunks(10, 0.5, world_size=2), pool_chunks(10, 3, world_size=2)
    (10, 5, 6)
    >>> steps_per_epoch(10, world_size=2, lock_step=True), steps_per_epoch(10, world_size=2, lock_step=False)
    (5, 10)
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Sampler

from lightning_hetero._lightning_internals import (
    layer_sync_requested,
    set_max_steps,
    validates_on_time_interval,
    with_sampler,
)
from lightning_hetero.async_ps.runtime.validation_points import ValidationPoints, check_interval
from lightning_hetero.contracts import ModeSwitcher
from lightning_hetero.epoch_order import sampler_order

_ABSENT = object()


def mode_switcher(trainer: pl.Trainer) -> ModeSwitcher | None:
    """The callback that switches the strategy's mode during training (``SyncSwitchCallback``), if any.

    Its ``policy`` is looked up statically: before Python 3.12 ``isinstance`` on the protocol calls ``__getattr__``,
    through which ``HeteroBatchCallback`` still serves a deprecated ``policy`` (it would pass for a switcher)."""
    switchers = (c for c in trainer.callbacks if inspect.getattr_static(c, "policy", _ABSENT) is not _ABSENT)
    return next(switchers, None)  # type: ignore[arg-type]


def only_lock_step(trainer: pl.Trainer, mode: str) -> bool:
    """Whether the whole run trains in lock-step (BSP, and no callback switches to another mode)."""
    return mode == "bsp" and mode_switcher(trainer) is None


def check_trainer(module: pl.LightningModule, trainer: pl.Trainer, mode: str) -> float | int:
    """Fail before the first batch, naming the setting, the reason and the alternative, for what the strategy cannot
    run; take ``limit_train_batches`` over (returned; Lightning's own is set to ``1.0``, see :func:`pool_chunks`).

    Args:
        module: the LightningModule.
        trainer: the Trainer.
        mode: the strategy's mode at the start.
    """
    lock_step = only_lock_step(trainer, mode)
    if not module.automatic_optimization and not lock_step:
        raise ValueError(
            f"AsyncPSStrategy(mode={mode!r}) supports manual optimization (`self.automatic_optimization = False`) "
            "in BSP only: in ASP the parameter server applies the optimizer and in local SGD the round's outer step "
            "does, which a hand-written training_step cannot drive"
            + (" (SyncSwitchCallback would switch this run to ASP)" if mode == "bsp" else "")
            + "; use automatic optimization, AsyncPSStrategy(mode='bsp') without SyncSwitchCallback, or "
            "strategy='ddp' with HeteroBatchCallback (which gives a slow rank a smaller batch and weights its "
            "manual_backward by its share)."
        )
    if layer_sync_requested(trainer.strategy):
        raise ValueError(
            "AsyncPSStrategy does not run Trainer(sync_batchnorm=True): it keeps each rank's BatchNorm and averages "
            "the running statistics where the ranks meet (in ASP and local SGD the ranks never run a forward pass "
            "together, and torch's SyncBatchNorm needs a GPU backend); remove sync_batchnorm, or use strategy='ddp' "
            "on GPUs."
        )
    if validates_on_time_interval(trainer):  # a duration leaves no `trainer.val_check_interval` at all
        raise ValueError(
            "AsyncPSStrategy does not validate every so many seconds (val_check_interval as a duration): each rank "
            "would read its own clock, and the ranks must agree on the point; give val_check_interval as a fraction "
            "of the epoch or a count of batches (the ranks agree on those), or use Lightning's Timer callback."
        )
    limit = trainer.limit_train_batches
    if limit is None or limit == 0:
        return 1.0
    trainer.limit_train_batches = 1.0  # the claim pool applies it (Lightning would refuse it on the claim loader)
    return limit


def lock_step_interval(trainer: pl.Trainer, batches_per_rank: int) -> None:
    """BSP alone: a fractional ``val_check_interval`` becomes the batch count it means (Lightning needs the loader's
    length for a fraction, and the claim loader has none).

    Args:
        trainer: the Trainer.
        batches_per_rank: each rank's batches per epoch.
    """
    interval = trainer.val_check_interval
    if isinstance(interval, float) and interval != 1.0:
        trainer.val_check_interval = max(1, int(batches_per_rank * interval))


def pool_chunks(chunks: int, limit: float | int, world_size: int) -> int:
    """Chunks (batches) in an epoch's claim pool of ``chunks``: a fraction of them, or ``limit`` batches per rank;
    at least one per rank (each rank's first chunk of an epoch is its own).

    Args:
        chunks: the batches of a whole epoch over all ranks.
        limit: ``limit_train_batches`` (a fraction, or an integer count per rank as under DDP).
        world_size: the number of ranks.
    """
    wanted = int(chunks * limit) if isinstance(limit, float) else int(limit) * world_size
    return min(chunks, max(world_size, wanted))


def update_budget(max_steps: int, world_size: int, lock_step: bool) -> int:
    """The bound on ``trainer.global_step`` that trains as much as ``max_steps`` does under DDP, where a step trains a
    batch on every rank: ``max_steps`` in lock-step (BSP), ``max_steps x world_size`` where every rank's batch is a
    step of its own (ASP's server updates, local SGD's local steps); -1 (no bound) as it is.

    Example::

        >>> update_budget(62, world_size=2, lock_step=False), update_budget(62, 2, True), update_budget(-1, 2, False)
        (124, 62, -1)
    """
    return max_steps if max_steps < 0 or lock_step else max_steps * world_size


def steps_per_epoch(chunks: int, world_size: int, lock_step: bool) -> int:
    """Optimizer steps ``trainer.global_step`` advances by in an epoch of ``chunks`` claimed batches: each rank's
    batches (they all step together) in BSP, every batch of every rank in ASP (server updates) and local SGD."""
    return math.ceil(chunks / world_size) if lock_step else chunks


class EstimateSampler(Sampler[int]):
    """Stands in for the claim sampler while Lightning loads the train loader before the run starts (it does for
    ``trainer.estimated_stepping_batches`` in ``configure_optimizers``): its length is the epoch's steps, so
    Lightning's estimate is the strategy's; the strategy loads the loader again once the run started.

    Args:
        samples: the loader's batch size times the epoch's steps.
    """

    def __init__(self, samples: int) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return self.samples

    def __iter__(self) -> Iterator[int]:
        raise RuntimeError("AsyncPSStrategy: the training loader was iterated before the run started")


def estimating_loader(
    dataloader: object, trainer: pl.Trainer, mode: str, world_size: int, limit: float | int
) -> object:
    """The train ``dataloader`` with an :class:`EstimateSampler` while fitting (any other loader as it is).

    Args:
        dataloader: a loader the strategy is asked to process.
        trainer: the Trainer.
        mode: the strategy's mode at the start.
        world_size: the number of ranks.
        limit: the taken-over ``limit_train_batches`` (given back to Lightning for a loader the claim sampler will
            leave alone).
    """
    if trainer.state.fn != TrainerFn.FITTING or trainer.state.stage != RunningStage.TRAINING:
        return dataloader
    if (
        not isinstance(dataloader, DataLoader)
        or dataloader.batch_size is None
        or sampler_order(dataloader.sampler) is None
    ):
        trainer.limit_train_batches = limit  # a loader the claim sampler leaves alone: Lightning's limit applies
        return dataloader
    batch = dataloader.batch_size
    chunks = pool_chunks(math.ceil(len(dataloader.dataset) / batch), limit, world_size)  # type: ignore[arg-type]
    steps = steps_per_epoch(chunks, world_size, only_lock_step(trainer, mode))
    return with_sampler(dataloader, EstimateSampler(steps * batch))


class TrainerLimits:
    """One strategy's view of the Trainer's settings: :meth:`check` at setup, then :meth:`loader` for loaders
    processed before the run starts; :attr:`limit` is the taken-over ``limit_train_batches``."""

    def __init__(self) -> None:
        self.limit: float | int = 1.0
        #: the taken-over ``val_check_interval`` inside an epoch (``None``: epoch ends, or BSP alone)
        self.points: ValidationPoints | None = None
        self._budget = -1  # the update budget set in Lightning's max_steps
        self._trainer: pl.Trainer | None = None
        self._mode = "asp"
        self._world_size = 1
        #: the steps per epoch Lightning's ``estimated_stepping_batches`` counted (``None`` before it was read)
        self.steps_per_epoch: int | None = None

    def check(self, module: pl.LightningModule, trainer: pl.Trainer, mode: str, world_size: int) -> None:
        """:func:`check_trainer` when fitting starts.

        Args:
            module: the LightningModule.
            trainer: the Trainer.
            mode: the strategy's mode at the start.
            world_size: the number of ranks.
        """
        limit = check_trainer(module, trainer, mode)
        points = None if only_lock_step(trainer, mode) else check_interval(trainer, mode)
        again = trainer is self._trainer  # a second fit: what the first took over stays taken over
        self.limit = self.limit if again and limit == 1.0 else limit
        self.points = self.points if again and points is None else points
        if not (again and trainer.max_steps == self._budget):
            self._budget = update_budget(trainer.max_steps, world_size, lock_step=mode == "bsp")
            if self._budget != trainer.max_steps:
                rank_zero_info(
                    f"AsyncPSStrategy(mode={mode!r}): max_steps={trainer.max_steps} trains what DDP's steps train (a "
                    f"batch on every rank), here {self._budget} updates of one rank's batch each (trainer.max_steps "
                    f"reads {self._budget}, as trainer.global_step counts them)."
                )
                set_max_steps(trainer, self._budget)
        self._trainer, self._mode, self._world_size = trainer, mode, world_size

    def loader(self, dataloader: object) -> object:
        """:func:`estimating_loader` once :meth:`check` ran (``dataloader`` itself before)."""
        if self._trainer is None:
            return dataloader
        loader = estimating_loader(dataloader, self._trainer, self._mode, self._world_size, self.limit)
        if loader is not dataloader and isinstance(loader.sampler, EstimateSampler):  # type: ignore[attr-defined]
            self.steps_per_epoch = len(loader.sampler) // loader.batch_size  # type: ignore[attr-defined]
        return loader
