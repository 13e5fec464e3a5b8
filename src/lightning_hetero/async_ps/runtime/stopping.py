"""Stopping together: in ASP and local SGD the ranks are not in lock-step, so a stop that one rank decides alone
(``max_steps`` reached by the server's version, Lightning's ``Timer`` for ``max_time``, any callback setting
``trainer.should_stop`` inside a batch) would send it to validation or to the end of training while the others still
train or wait in a collective. Here a rank's wish to stop closes the epoch's claim pool instead, so that every rank
runs dry within a batch or two (local SGD: within the round it has claimed) and ends the epoch through the usual
last-batch path; at the epoch's end the ranks meet, and they stop there together:

- ``max_steps`` (Lightning's, which :func:`~lightning_hetero.async_ps.runtime.trainer_limits.update_budget` set to the user's times
  the world size): until its last batch of an epoch a rank shows Lightning at most ``max_steps - 1`` steps (the server
  refuses updates past ``max_steps``); at the epoch's end every rank takes the server's final version (ASP) or the
  last round's combined count (local SGD) and Lightning ends the run at the same version on every rank.
- ``trainer.should_stop`` set inside an asynchronous batch: taken back on that rank, recorded in rank 0's store, and
  set again on every rank once they have met at the epoch's end.

In BSP (lock-step) nothing changes: Lightning's own collective decisions hold.

Example::

    >>> stop = StepCeiling(max_steps=30)
    >>> stop.shown(29, mid_epoch=True), stop.shown(31, mid_epoch=True), stop.shown(31, mid_epoch=False)
    (29, 29, 31)
    >>> stop.spent(29), stop.spent(30), StepCeiling(max_steps=-1).shown(10**6, mid_epoch=True)
    (False, True, 1000000)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info

from lightning_hetero._lightning_internals import is_last_batch

if TYPE_CHECKING:
    from lightning_hetero.async_ps.interfaces import Engine
    from lightning_hetero.async_ps.runtime.context import PSContext
    from lightning_hetero.async_ps.runtime.fault_tolerance import FaultTolerance

#: the store key a rank sets when it asked to stop inside an asynchronous batch
STOP_KEY = "stop/requested"


@dataclass(frozen=True)
class StepCeiling:
    """``max_steps`` as the ranks see it mid-epoch while not in lock-step (see the module's docstring).

    Args:
        max_steps: Lightning's ``max_steps`` (-1: no bound).
    """

    max_steps: int

    def spent(self, version: int) -> bool:
        """Whether the update budget is spent at ``version``."""
        return 0 <= self.max_steps <= version

    def shown(self, version: int, mid_epoch: bool) -> int:
        """The step count to show Lightning: below ``max_steps`` until the rank's epoch ends, so no rank stops alone."""
        if self.max_steps < 0 or not mid_epoch:
            return version
        return min(version, max(self.max_steps - 1, 0))


class AgreedStop:
    """One fitting run's stop agreement (built by :func:`~lightning_hetero.async_ps.runtime.bootstrap.start_run`).

    Args:
        ctx: the run's shared context (the store, the claim sampler, the Trainer).
        fault: the fault tolerance (the ranks' meetings).
        engine: the engine in force.
    """

    def __init__(self, ctx: PSContext, fault: FaultTolerance, engine: Callable[[], Engine]) -> None:
        self.ctx = ctx
        self.fault = fault
        self._engine = engine
        self.ceiling = StepCeiling(ctx.trainer.max_steps)
        self._closed_epoch = -1
        #: why this rank closed the pool last (``None``: it did not), for the message at the epoch's end
        self.reason: str | None = None

    def _asynchronous(self) -> bool:
        return self.ctx.active and not self._engine().lock_step

    def shown_step(self, version: int, in_step: bool) -> int:
        """The ``global_step`` to show for ``version`` (``StepCounter``'s ceiling); a spent budget closes the pool."""
        if not self._asynchronous():
            return version
        if self.ceiling.spent(version):
            self.close_pool(f"max_steps={self.ceiling.max_steps} reached")
        return self.ceiling.shown(version, mid_epoch=in_step and not is_last_batch(self.ctx.trainer))

    def close_pool(self, reason: str) -> None:
        """End the epoch for every rank: claim what is left of the epoch's pool (once per epoch)."""
        epoch = self.ctx.trainer.current_epoch
        sampler = self.ctx.claim_sampler
        if epoch == self._closed_epoch or sampler is None:
            return
        self._closed_epoch, self.reason = epoch, reason
        sampler.close(epoch)

    def batch_end(self, trainer: pl.Trainer) -> None:
        """After the batch's callbacks: a ``should_stop`` set inside an asynchronous batch waits for the epoch's end."""
        if not trainer.should_stop or not self._asynchronous():
            return
        trainer.should_stop = False
        self.ctx.store.set(STOP_KEY, "1")
        self.close_pool("a stop was requested (trainer.should_stop, e.g. max_time)")

    def epoch_end(self, trainer: pl.Trainer) -> None:
        """Where the ranks meet at the epoch's end: they take the final version and a stop any of them asked for."""
        if not self._asynchronous():
            return
        self.fault.meet()
        self._engine().epoch_end()
        if self.ctx.store.check([STOP_KEY]):
            trainer.should_stop = True
        if (trainer.should_stop or self.ceiling.spent(self.ctx.counter.version)) and self.reason is not None:
            rank_zero_info(f"AsyncPSStrategy: every rank stops at this epoch's end ({self.reason}).")


class StopAtEpochEnd(Callback):
    """The batch-end glue of :class:`AgreedStop`, appended to the Trainer's callbacks by the strategy (so it runs
    after ``Timer`` and the user's callbacks in each batch).

    Args:
        stop: the run's stop agreement.
    """

    def __init__(self, stop: AgreedStop) -> None:
        self.stop = stop

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        self.stop.batch_end(trainer)


class MeetAtEpochEnd(Callback):
    """The epoch-end glue of :class:`AgreedStop`, put first among the Trainer's callbacks by the strategy.

    At an epoch's end Lightning computes each epoch metric, and with it a synchronised metric's collective, on the
    first read of any rank: rank 0's progress bar reads them in its ``on_train_epoch_end``, where the other ranks'
    disabled bars do not. The ranks' meeting is a collective too, so it must come before any callback's epoch end on
    every rank: then each rank's metric collectives follow the meeting in the same order, as in DDP.

    Args:
        stop: the run's stop agreement.
    """

    def __init__(self, stop: AgreedStop) -> None:
        self.stop = stop

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            self.stop.epoch_end(trainer)


def install(trainer: pl.Trainer, stop: AgreedStop) -> None:
    """Put ``stop``'s epoch-end meeting first and its batch-end glue last among ``trainer``'s callbacks (replacing
    an earlier fit's)."""
    kept = [c for c in trainer.callbacks if not isinstance(c, (StopAtEpochEnd, MeetAtEpochEnd))]
    trainer.callbacks = [MeetAtEpochEnd(stop), *kept, StopAtEpochEnd(stop)]
