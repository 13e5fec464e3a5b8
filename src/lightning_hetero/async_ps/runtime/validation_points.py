"""Validating inside an epoch (``val_check_interval``) when the ranks are not in lock-step: in ASP and local SGD each
rank runs its own number of batches, so Lightning's rule (after every ``k``-th batch of the rank) would send the
ranks to validation at different times. Here the interval is a point of the epoch's *claim pool* instead, agreed by
every rank:

- The pool of ``P`` batches is cut into segments at the positions DDP would validate at: ``val_check_interval=f``
  validates after every ``max(1, int(f x N))`` batches of a rank, ``N = ceil(P / world_size)`` (DDP's batches per
  rank), so the segments are ``that x world_size`` batches of the pool long; an integer ``k`` is ``k x world_size``
  batches of the pool (with ``check_val_every_n_epoch=None`` counted across epochs, as DDP counts ``k`` across
  them). The epoch's end validates where DDP's would (its last batch a multiple of the interval).
- Each segment is claimed like an epoch (:class:`~lightning_hetero.async_ps.runtime.sampler.ClaimSampler`): each rank's first
  batch of it is reserved, the rest are claimed from the segment's own counter, so a fast rank takes more of it, and
  every rank trains at least one batch in every segment.
- A rank validates after its last batch of a segment (the next batch its loader holds lies in a later segment): the
  ranks meet there, ASP ranks take the server's version once all of the segment's updates are applied, local SGD
  ranks end their round together (the segment's end is a round's end), and Lightning validates on every rank.

While the ranks train in lock-step (BSP epochs of a run ``SyncSwitchCallback`` switches) the same points are a rank's
``k``-th batch, as under DDP. A segment shorter than one batch per rank is merged into the one before it (its
validation moves to the epoch's end), so no rank ever skips a validation point.

Example: 24 batches an epoch over 2 ranks (12 each, as DDP's)::

    >>> ValidationPoints(0.5, every_n_epochs=1).plan(epoch=0, pool_chunks=24, world_size=2)
    ([12], True)
    >>> ValidationPoints(0.3, every_n_epochs=1).plan(epoch=0, pool_chunks=24, world_size=2)  # every 3 of 12
    ([6, 12, 18], True)
    >>> ValidationPoints(5, every_n_epochs=None).plan(epoch=1, pool_chunks=24, world_size=2)  # a rank's 15th and 20th
    ([6, 16], False)
    >>> ValidationPoints(0.5, every_n_epochs=2).plan(epoch=0, pool_chunks=24, world_size=2)  # not a validating epoch
    ([], False)
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from lightning_hetero._lightning_internals import is_last_batch, set_val_check_batch

if TYPE_CHECKING:
    from lightning_hetero.async_ps.interfaces import ModeFlags
    from lightning_hetero.async_ps.runtime.sampler import ClaimSampler


@dataclass(frozen=True)
class ValidationPoints:
    """``val_check_interval`` as points of the epoch's claim pool (see the module's docstring).

    Args:
        interval: ``val_check_interval``: a fraction of the epoch, or a count of each rank's batches.
        every_n_epochs: ``check_val_every_n_epoch`` (``None``: an integer interval counts across epochs).
    """

    interval: float | int
    every_n_epochs: int | None

    def per_rank(self, pool_chunks: int, world_size: int) -> int:
        """DDP's ``val_check_batch``: validate after every this many batches of a rank."""
        if isinstance(self.interval, float):
            return max(1, int(math.ceil(pool_chunks / world_size) * self.interval))
        return int(self.interval)

    def plan(self, epoch: int, pool_chunks: int, world_size: int) -> tuple[list[int], bool]:
        """The epoch's validation points inside it (pool positions, in batches, where a segment starts) and whether
        its end validates.

        Args:
            epoch: the epoch.
            pool_chunks: the batches of the epoch's claim pool (over all ranks).
            world_size: the number of ranks.
        """
        if self.every_n_epochs is not None and (epoch + 1) % self.every_n_epochs:
            return [], False
        batches = math.ceil(pool_chunks / world_size)
        every = self.per_rank(pool_chunks, world_size)
        before = 0 if self.every_n_epochs is not None else epoch * batches  # a rank's batches in earlier epochs
        inside = [j for j in range(1, batches) if (before + j) % every == 0]
        points = [j * world_size for j in inside if pool_chunks - j * world_size >= world_size]
        at_end = (before + batches) % every == 0 or len(points) < len(inside)
        return points, at_end


def check_interval(trainer: pl.Trainer, mode: str) -> ValidationPoints | None:
    """Take a mid-epoch ``val_check_interval`` (a fraction or a count) over from Lightning, which then sees ``1.0``
    and validates only where this module says; ``None`` where the run validates at epoch ends only. Refuses, naming
    the setting, the reason and the alternative, what cannot agree.

    Args:
        trainer: the Trainer.
        mode: the strategy's mode at the start.
    """
    interval = trainer.val_check_interval
    if isinstance(interval, float) and interval == 1.0:
        return None
    if mode == "local" and trainer.accumulate_grad_batches > 1:
        raise ValueError(
            f"AsyncPSStrategy(mode='local') cannot validate inside an epoch (val_check_interval={interval!r}) with "
            f"accumulate_grad_batches={trainer.accumulate_grad_batches}: a validation point must end a round, which "
            "only an optimizer step can, and a rank may reach it between two steps; use val_check_interval=1.0, or "
            "no gradient accumulation."
        )
    trainer.val_check_interval = 1.0
    return ValidationPoints(interval, trainer.check_val_every_n_epoch)


def refuse_without_claims(points: ValidationPoints | None, reason: str | None) -> None:
    """Refuse mid-epoch validation (``points``) where the training loader is not claimed from a pool cut at the
    points (``reason`` says why not; ``None``: it is)."""
    if points is None or reason is None:
        return
    raise ValueError(
        f"AsyncPSStrategy validates at epoch ends only here (val_check_interval={points.interval!r}): {reason}, so "
        "the ranks could not agree on a point inside an epoch; use val_check_interval=1.0 (shorter epochs with "
        "limit_train_batches), or mode='bsp'."
    )


class ValidateTogether(Callback):
    """The Lightning glue of :class:`ValidationPoints`, appended to the Trainer's callbacks by the strategy: after
    each training batch it tells Lightning's loop whether this rank validates now (Lightning's
    ``trainer.val_check_batch``: 1 for yes, a count never reached for no).

    Args:
        sampler: the training loader's claim sampler (``None`` before the loader is built, or for a custom one).
        world_size: the number of ranks.
        mode: the mode in force (lock-step or not).
        points: the validation points.
    """

    def __init__(
        self,
        sampler: Callable[[], ClaimSampler | None],
        world_size: int,
        mode: Callable[[], ModeFlags],
        points: ValidationPoints,
    ) -> None:
        self._sampler = sampler
        self._world_size = world_size
        self._mode = mode
        self.points = points

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        sampler = self._sampler()
        if sampler is None:
            return
        pool, world_size = -(-sampler.epoch_samples // sampler.chunk_size), self._world_size
        points, at_end = self.points.plan(trainer.current_epoch, pool, world_size)
        if is_last_batch(trainer):
            validate = at_end
        elif self._mode().lock_step:
            validate = (batch_idx + 1) * world_size in points
        else:
            validate = sampler.segment_ended()
        set_val_check_batch(trainer, 1 if validate else sys.maxsize)


def install(trainer: pl.Trainer, callback: ValidateTogether | None) -> None:
    """Put ``callback`` last among ``trainer``'s callbacks (replacing an earlier fit's; ``None``: remove it)."""
    kept = [c for c in trainer.callbacks if not isinstance(c, ValidateTogether)]
    trainer.callbacks = kept + ([callback] if callback is not None else [])
