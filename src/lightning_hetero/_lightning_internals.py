"""The one place where lightning-hetero touches Lightning's private names and attributes.

Every other module reaches Lightning through its public API or through a small named function here. Each function
says which Lightning versions it was checked against, and ``tests/test_lightning_internals.py`` has a test per
function that fails loudly when Lightning changes the thing it relies on, so a Lightning upgrade breaks one test
with a clear name instead of silently turning a feature off.
"""

from __future__ import annotations

import inspect
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.optim import Optimizer
from torch.utils.data import DataLoader, Sampler

# No module-level import of Lightning here: importing Lightning registers "async_ps" (see _registration), which
# imports async_ps/, which imports this module; a Lightning import at the top would make that a cycle whenever this
# module is imported first. The functions import what they touch.
if TYPE_CHECKING:
    import lightning.pytorch as pl

# --- trainer, loops and data (used by hetero_batch/ and lr_schedules.py) ---
#
# Checked against Lightning 2.6.6 (pyproject allows lightning>=2.2).

#: An ``LRSchedulerConfig.frequency`` that Lightning's training loop never reaches: a config with it is never stepped
#: by the loop (see :func:`pause_lr_scheduler`).
NEVER_STEPPED = sys.maxsize


def pause_lr_scheduler(config: Any) -> int:
    """Stop Lightning's training loop from stepping the scheduler of ``config`` (an ``LRSchedulerConfig``); return
    the frequency to give back to :func:`resume_lr_scheduler`.

    Lightning has no public way for a callback or strategy to take a step-interval scheduler away from its loop.
    ``frequency`` is a public field of the config, but what this relies on is private: checked against Lightning
    2.6.6, ``TrainingEpochLoop._update_learning_rates`` steps a config when ``(batch_idx + 1) % frequency == 0``, so a
    frequency of :data:`NEVER_STEPPED` is never due.

    Example::

        >>> from types import SimpleNamespace
        >>> config = SimpleNamespace(frequency=3)
        >>> pause_lr_scheduler(config), lr_scheduler_paused(config)
        (3, True)
        >>> resume_lr_scheduler(config, 3)
        >>> config.frequency, lr_scheduler_paused(config)
        (3, False)
    """
    frequency = int(config.frequency)
    config.frequency = NEVER_STEPPED
    return frequency


def resume_lr_scheduler(config: Any, frequency: int) -> None:
    """Give a scheduler paused by :func:`pause_lr_scheduler` back to Lightning's loop with its own ``frequency``."""
    config.frequency = frequency


def lr_scheduler_paused(config: Any) -> bool:
    """Whether ``config`` is paused (by this package, possibly by another owner); see :func:`pause_lr_scheduler`."""
    return config.frequency >= NEVER_STEPPED


class _RebuiltDataSource:
    """Stands in for the fit loop's train-dataloader source and passes what it returns through ``rebuild``."""

    def __init__(self, source: Any, rebuild: Callable[[Any], Any]) -> None:
        self.source = source
        self.rebuild = rebuild

    def dataloader(self) -> Any:
        return self.rebuild(self.source.dataloader())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)


def rebuild_train_dataloader(trainer: Any, rebuild: Callable[[Any], Any]) -> None:
    """Make ``trainer``'s fit loop pass the user's train loader through ``rebuild`` each time it requests it, before
    Lightning processes it (injects a ``DistributedSampler``, wraps it in a ``CombinedLoader``). Idempotent: a second
    call replaces the first ``rebuild``.

    Lightning has no public hook between "the user's train loader exists" and "Lightning injects a sampler into it".
    Checked against Lightning 2.6.6: ``_FitLoop.setup_data`` requests the loader from ``fit_loop._data_source`` (a
    ``_DataLoaderSource``) through its ``dataloader()`` method, and reads nothing else from it that this stand-in
    does not forward.

    Raises:
        RuntimeError: when the fit loop has no ``_data_source`` (a Lightning version this was not checked against).
    """
    fit_loop = trainer.fit_loop
    if not hasattr(fit_loop, "_data_source"):
        raise RuntimeError(
            "lightning-hetero could not find the train data source on this Lightning version's fit loop "
            "(checked against Lightning 2.6.6); please report your Lightning version"
        )
    source = fit_loop._data_source
    if isinstance(source, _RebuiltDataSource):
        source = source.source
    fit_loop._data_source = _RebuiltDataSource(source, rebuild)


# --- strategies, launchers and module state (used by async_ps/) ---
#
# Each function below was checked against Lightning 2.6.6 (pyproject allows lightning>=2.2); its test in
# tests/test_lightning_internals.py names the private thing it relies on.


def optimizers_to_device(optimizers: Iterable[Optimizer], device: torch.device) -> None:
    """Move the optimizers' state tensors to ``device``, as Lightning's strategies do after loading state.

    Relies on ``lightning.fabric.utilities.optimizer._optimizers_to_device`` (checked against Lightning 2.6.6).
    """
    from lightning.fabric.utilities.optimizer import _optimizers_to_device

    _optimizers_to_device(optimizers, device)


def sync_module_states(module: torch.nn.Module) -> None:
    """Broadcast rank 0's parameters and buffers to every rank of the default group (no-op when not distributed).

    Relies on ``lightning.pytorch.overrides.distributed._sync_module_states`` (checked against Lightning 2.6.6).
    """
    from lightning.pytorch.overrides.distributed import _sync_module_states

    _sync_module_states(module)


def launched_processes(launcher: object) -> list[subprocess.Popen] | None:
    """The list of child processes Lightning's subprocess launcher started (local ranks 1..), the launcher's own list
    object (removing a process from it stops Lightning's observer from acting on its exit); ``None`` when the ranks
    were not started by that launcher (torchrun, SLURM, one process per node).

    Relies on ``_SubprocessScriptLauncher`` and its ``procs`` list (checked against Lightning 2.6.6).
    """
    from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher

    return launcher.procs if isinstance(launcher, _SubprocessScriptLauncher) else None


def kill_launched_processes(launcher: object) -> None:
    """SIGKILL the child processes Lightning's subprocess launcher started (no-op for other launchers): Lightning
    leaves them running when the main process fails with anything but ``KeyboardInterrupt``.

    Relies on ``_SubprocessScriptLauncher.kill(signum)`` (checked against Lightning 2.6.6).
    """
    from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher

    if isinstance(launcher, _SubprocessScriptLauncher):
        launcher.kill(signal.SIGKILL)


def with_sampler(dataloader: DataLoader, sampler: Sampler) -> DataLoader:
    """A copy of the training ``dataloader`` re-instantiated with ``sampler`` (its other arguments kept), as Lightning
    does when it injects a ``DistributedSampler``.

    Relies on ``lightning.pytorch.utilities.data._update_dataloader`` (checked against Lightning 2.6.6).
    """
    from lightning.pytorch.trainer.states import RunningStage
    from lightning.pytorch.utilities.data import _update_dataloader

    return _update_dataloader(dataloader, sampler, mode=RunningStage.TRAINING)


def uses_distributed_sampler(trainer: pl.Trainer) -> bool:
    """``Trainer(use_distributed_sampler=...)``, which the Trainer keeps only on its accelerator connector.

    Relies on ``trainer._accelerator_connector.use_distributed_sampler`` (checked against Lightning 2.6.6).
    """
    return bool(trainer._accelerator_connector.use_distributed_sampler)


def layer_sync_requested(strategy: object) -> bool:
    """Whether ``Trainer(sync_batchnorm=True)`` asked the strategy to convert BatchNorm layers.

    Relies on ``ParallelStrategy._layer_sync`` (set by the accelerator connector; checked against Lightning 2.6.6).
    """
    return getattr(strategy, "_layer_sync", None) is not None


def forget_train_dataloader(trainer: pl.Trainer) -> None:
    """Make the fit loop load its train loader again (one loaded before the strategy's run started, for
    ``trainer.estimated_stepping_batches``, lacks the strategy's sampler).

    Relies on ``trainer.fit_loop._combined_loader`` (checked against Lightning 2.6.6).
    """
    trainer.fit_loop._combined_loader = None


def validates_on_time_interval(trainer: pl.Trainer) -> bool:
    """Whether the trainer validates every so many seconds (``val_check_interval`` given as a duration).

    Relies on ``trainer._val_check_time_interval`` (``None`` unless a duration was given; checked against Lightning
    2.6.6). Lightning before 2.6 has neither the attribute nor time-based validation (``False``); from 2.6 on, a
    missing attribute raises rather than silently answering ``False``.
    """
    if not hasattr(trainer, "_val_check_time_interval"):
        _require_before_2_6("trainer._val_check_time_interval")
        return False
    return trainer._val_check_time_interval is not None


def _require_before_2_6(what: str) -> None:
    """Raise unless this Lightning predates 2.6 (whose private ``what`` lightning-hetero relies on)."""
    import lightning
    from packaging.version import Version

    if Version(lightning.__version__).release >= (2, 6):
        raise RuntimeError(
            f"lightning-hetero could not find {what} on Lightning {lightning.__version__} (checked against 2.6.6); "
            "please report your Lightning version"
        )


def replace_sigterm_broadcast(trainer: pl.Trainer, check: Callable[[Callable[[], None]], None]) -> None:
    """Replace the SIGTERM flag broadcast Lightning's training epoch loop runs before every batch with ``check``,
    which receives Lightning's own broadcast (to call when the ranks are in lock-step).

    Relies on ``fit_loop.epoch_loop._broadcast_sigterm_tensor`` (checked against Lightning 2.6.6). Lightning before
    2.6 may not broadcast (nothing to replace); from 2.6 on, a missing method raises.
    """
    epoch_loop = trainer.fit_loop.epoch_loop
    synchronous = getattr(epoch_loop, "_broadcast_sigterm_tensor", None)
    if synchronous is None:
        _require_before_2_6("the training epoch loop's _broadcast_sigterm_tensor")
        return
    epoch_loop._broadcast_sigterm_tensor = lambda: check(synchronous)


def load_strategy_checkpoint(
    load: Callable[..., dict[str, Any]], checkpoint_path: Any, weights_only: bool | None
) -> dict[str, Any]:
    """Call a strategy's ``load_checkpoint`` (``load``, e.g. ``super().load_checkpoint``), passing ``weights_only``
    only where Lightning's ``Strategy.load_checkpoint`` takes it.

    Checked against Lightning 2.6.6, where the Trainer passes ``weights_only`` through; Lightning before 2.6 has no such
    parameter (its Trainer never passes one, so ``weights_only`` is then ``None``) and gets the path alone.

    Example::

        >>> def before_2_6(path):
        ...     return {"path": path}
        >>> def from_2_6(path, weights_only=None):
        ...     return {"path": path, "weights_only": weights_only}
        >>> load_strategy_checkpoint(before_2_6, "last.ckpt", None)
        {'path': 'last.ckpt'}
        >>> load_strategy_checkpoint(from_2_6, "last.ckpt", False)
        {'path': 'last.ckpt', 'weights_only': False}
    """
    if "weights_only" in inspect.signature(load).parameters:
        return load(checkpoint_path, weights_only=weights_only)
    return load(checkpoint_path)


def is_last_batch(trainer: pl.Trainer) -> bool:
    """Whether the training batch in progress is the epoch's last one.

    Relies on ``fit_loop.epoch_loop.batch_progress.is_last_batch`` (checked against Lightning 2.6.6).
    """
    return bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)


def inside_training_batch(trainer: pl.Trainer) -> bool:
    """Whether a training batch has started and not completed (its step, hooks and logging are running).

    Relies on ``fit_loop.epoch_loop.batch_progress.current`` (``ready`` and ``completed``; checked against Lightning
    2.6.6).
    """
    current = trainer.fit_loop.epoch_loop.batch_progress.current
    return current.ready > current.completed


def set_global_step(trainer: pl.Trainer, steps: int, in_step: bool) -> None:
    """Make ``trainer.global_step`` read ``steps`` (inside an optimizer step: once the loop counts the step in
    progress, which it does by one).

    Relies on ``fit_loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step.total`` (``ready`` and
    ``completed``), whose ``completed`` is ``trainer.global_step`` (checked against Lightning 2.6.6).
    """
    counter = trainer.fit_loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step.total
    counter.ready = steps
    counter.completed = steps - 1 if in_step else steps


def set_max_steps(trainer: pl.Trainer, steps: int) -> None:
    """Make ``trainer.max_steps`` (what the fit loop stops at and ``estimated_stepping_batches`` reads) ``steps``.

    Relies on ``fit_loop.epoch_loop.max_steps``, which ``trainer.max_steps`` and ``fit_loop.max_steps`` read (no setter
    on either; checked against Lightning 2.6.6).
    """
    trainer.fit_loop.epoch_loop.max_steps = steps


def set_val_check_batch(trainer: pl.Trainer, batches: int) -> None:
    """Make Lightning's training loop validate after the batch in progress when ``(batch + 1) % batches == 0`` (1:
    now; a count never reached: not now, not even at the epoch's last batch).

    Relies on ``trainer.val_check_batch``, which ``_FitLoop.setup_data`` sets from ``val_check_interval`` at each
    epoch's start and ``_TrainingEpochLoop._should_check_val_fx`` reads after each batch's ``on_train_batch_end``
    (checked against Lightning 2.6.6).
    """
    trainer.val_check_batch = batches


def set_current_epoch(trainer: pl.Trainer, epoch: int) -> None:
    """Make ``trainer.current_epoch`` read ``epoch`` before the fit loop starts its next epoch (a worker joining a
    running job at its epoch), as a resumed checkpoint's loop state does.

    Relies on ``fit_loop.epoch_progress`` (``current`` and ``total``: ``ready``, ``started``, ``processed``,
    ``completed``), whose ``current.completed`` is ``trainer.current_epoch`` (checked against Lightning 2.6.6).
    """
    progress = trainer.fit_loop.epoch_progress
    for counter in (progress.current, progress.total):
        counter.ready = counter.started = counter.processed = counter.completed = epoch


def advance_current_epoch(trainer: pl.Trainer, epochs: int) -> None:
    """Move ``trainer.current_epoch`` on by ``epochs`` in the middle of the fit loop (an elastic worker that fetched
    the job's state from a peer after the job finished epochs without it), keeping the counters' offsets (an epoch
    in progress is ``ready`` and ``started`` one ahead of ``completed``).

    Relies on ``fit_loop.epoch_progress`` as :func:`set_current_epoch` does (checked against Lightning 2.6.6).
    """
    progress = trainer.fit_loop.epoch_progress
    for counter in (progress.current, progress.total):
        counter.ready += epochs
        counter.started += epochs
        counter.processed += epochs
        counter.completed += epochs


def rebuild_validation_loaders(trainer: pl.Trainer) -> None:
    """Make the fit loop build its validation loaders again (for example after the ranks sharing them changed):
    Lightning otherwise keeps the ones built at the first validation.

    Relies on ``fit_loop.epoch_loop.val_loop._combined_loader`` being its cache (checked against Lightning 2.6.6).
    """
    val_loop = trainer.fit_loop.epoch_loop.val_loop
    val_loop._combined_loader = None
    val_loop.setup_data()
    val_loop.reset()


def set_default_group_timeout(timeout: timedelta) -> None:
    """Set the default process group's timeout after it was created (torch's, not Lightning's: the one private
    torch function the package uses, kept here with the others).

    Relies on ``torch.distributed.distributed_c10d._set_pg_timeout`` (checked against torch 2.13).
    """
    dist.distributed_c10d._set_pg_timeout(timeout)
