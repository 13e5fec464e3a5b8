"""``HeteroBatchCallback``: Lightning glue that feeds the tuner from Trainer hooks and applies its splits.

The decisions live in :class:`~lightning_hetero.hetero_batch.tuner.SplitTuner` (no Trainer in it); this module
measures each step, runs the one exchange per adjustment, puts decided splits in force in the loader, and weights
each rank's gradient by its batch share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from lightning_hetero._deprecation import renamed_argument, warn_renamed
from lightning_hetero._lightning_internals import rebuild_train_dataloader
from lightning_hetero.batch_weighting import batch_share
from lightning_hetero.contracts import HeteroBatchStrategy
from lightning_hetero.hetero_batch.batches import (
    HeteroBatchSampler,
    RecompileWatch,
    build_hetero_loader,
    mark_batch_dynamic,
    starting_batch_size,
)
from lightning_hetero.hetero_batch.gradients import step_weight, weight_backward
from lightning_hetero.hetero_batch.memory import MemoryGuard, auto_memory_guard, respect_caps, restore_caps, saved_caps
from lightning_hetero.hetero_batch.period import adjusts_after, describe, gather_rows, read_rows
from lightning_hetero.hetero_batch.settings import (
    check_settings,
    check_trainer,
    lr_scale_factor,
    model_floor,
    new_tuner,
    scale_learning_rates,
)
from lightning_hetero.hetero_batch.timing import (
    ComputeEndMarks,
    PendingSteps,
    WaitExclusion,
    quota_source,
    warn_shared_devices,
)
from lightning_hetero.hetero_batch.tuner import SplitTuner, adjustment_metrics
from lightning_hetero.measurement import (
    BusyTimer,
    ComputeTimer,
    ThroughputMeter,
    close_compute_window,
    sustained_step_s,
)
from lightning_hetero.step_clock import HostClock, step_clock_for

#: the callback's former attributes now on ``callback.tuner`` (deprecated on the callback)
MOVED_TO_TUNER = ("controller", "policy", "plan", "cost", "period", "costs", "busy_s", "sync_step_s", "throughputs")


class HeteroBatchCallback(Callback):
    """Resize each rank's share of every global batch in proportion to its measured compute throughput.

    Each rank measures its *busy* time per step (wall time minus every wait for other ranks, see
    :mod:`~lightning_hetero.hetero_batch.timing`; under a CPU quota at least its CPU time at the quota's rate) and fits
    it per adjustment period as a fixed overhead plus a per-sample cost
    (:class:`~lightning_hetero.hetero_batch.cost_model.PeriodCostModel`). At each adjustment all ranks exchange their
    fits and the measured synchronous step (:mod:`~lightning_hetero.hetero_batch.period`) and apply the same
    decision (:class:`~lightning_hetero.hetero_batch.policy.AdjustmentPolicy`): the split that equalises their
    predicted step times, never giving a slower rank more samples than a faster one, rolled back if the synchronous
    step measured after it is slower. The global batch stays constant, every sample is used once per epoch, every
    rank does the same number of steps, and gradients are combined as the batch-weighted mean ``Σ b_k g_k / Σ b_k``:
    the optimisation is that of one big batch. The train loader's ``batch_size`` is the starting per-rank size.

    Example::

        >>> import lightning as L
        >>> from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule
        >>> callback = HeteroBatchCallback(verbose=False)
        >>> trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, callbacks=[callback], logger=False,
        ...                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        >>> trainer.fit(MLPClassifier(), datamodule=SyntheticClassificationDataModule(num_samples=256, batch_size=32))
        >>> callback.batch_sizes
        (32,)

    Args:
        global_batch_size: the sum of all ranks' batch sizes; default: the loader's ``batch_size`` x world size.
        initial_batch_sizes: a starting split, one size per rank, summing to the global batch (for example from
            known hardware); default: equal shares.
        min_batch_size: smallest per-rank batch (an int, or one per rank).
        max_batch_size: largest per-rank batch (an int, one per rank, or ``None``).
        memory_caps: per-rank largest batch that fits in memory, or ``"auto"``: each rank finds its own, and a
            step that runs out of memory is redone in chunks under a lowered cap (see
            :mod:`~lightning_hetero.hetero_batch.memory`).
        batch_size_multiple: per-rank sizes are drawn from multiples of this; ``"auto"``: 8 on CUDA when an equal
            share holds four multiples of 8, else 1 (see :func:`~.settings.resolve_batch_size_multiple`).
        deadband: apply a new split only when it is predicted to shorten the synchronous step by more than this
            fraction (a cluster-wide decision); a smaller gain beyond 2% and the measurement noise, proposed at two
            adjustments in a row, is applied too (a refinement, see
            :class:`~lightning_hetero.hetero_batch.policy.AdjustmentPolicy`).
        smoothing: EWMA weight of the newest compute-window throughput in ``meter`` (which
            :class:`~lightning_hetero.switching.SyncSwitchCallback` reads); the split itself follows busy times.
        warmup_steps: measurements discarded at the start of fit (and one after each change of split).
        rollback_tolerance: a change of split is undone when the synchronous step measured after it is slower than
            the one measured before it by more than this fraction.
        lr_scaling: deprecated old name of ``batch_lr_scaling``; removed in the next release.
        change_tolerance: a rank whose measured busy time misses its model's prediction by more than this fraction
            forgets its older measurements (its speed changed, or the model was wrong) and starts again from the
            newest period.
        adjust_every_n_steps: also adjust every ``n`` optimizer steps inside an epoch; by default the split changes
            at epoch ends, once or twice early in the first epoch and every 32 steps inside an epoch
            (:mod:`~lightning_hetero.hetero_batch.period`).
        batch_lr_scaling: ``"linear"`` or ``"sqrt"`` to rescale learning rates when ``global_batch_size`` differs
            from the loader's ``batch_size`` x world size; ``None`` leaves them alone. (Not to be confused with
            ``AsyncPSStrategy(lr_scaling=...)``, which scales each update by its staleness.)
        seed: seeds the per-epoch permutation, identically on every rank.
        verbose: print the end-of-fit summary on rank 0.

    Notes:
        - Works with ``strategy="ddp"`` (any DDP launcher; CPU/gloo and CUDA/NCCL), with single-device training,
          with ``strategy="fsdp"`` (accepted, not yet run: it needs CUDA) and with strategies that offer :class:`~lightning_hetero.contracts.HeteroBatchStrategy` such as
          :class:`~lightning_hetero.AsyncPSStrategy`.
        - The model's loss must be a mean over the local batch (the usual reduction), so that weighting by
          ``b_k / Σ b`` yields the big-batch mean. Batch norm sees per-rank batches of different sizes.
        - Collectives called directly through ``torch.distributed`` (not through the strategy) are not seen and
          count as the rank's own busy time.
        - With ``accumulate_grad_batches`` each micro-batch's loss is weighted so that a step's gradient is the big
          batch's over all its micro-batches (:mod:`~lightning_hetero.hetero_batch.gradients`).
        - With manual optimization (``self.automatic_optimization = False``) each ``manual_backward`` is weighted
          as the automatic backward is, so each loss must be a mean over the rank's batch; ``memory_caps="auto"``
          is refused there.
        - While a strategy trains asynchronously (``AsyncPSStrategy`` in ASP) ranks are not in lock-step, so
          ``adjust_every_n_steps`` is ignored there and the split changes at epoch ends only.
        - The split in force is part of the callback's checkpoint state; a resumed run continues with it.
    """

    def __init__(
        self,
        global_batch_size: int | None = None,
        initial_batch_sizes: Sequence[int] | None = None,
        min_batch_size: int | Sequence[int] = 1,
        max_batch_size: int | Sequence[int] | None = None,
        memory_caps: Sequence[int | None] | str | None = None,
        deadband: float = 0.05,
        smoothing: float = 0.5,
        warmup_steps: int = 3,
        adjust_every_n_steps: int | None = None,
        batch_lr_scaling: str | None = None,
        seed: int = 0,
        verbose: bool = True,
        rollback_tolerance: float = 0.15,
        change_tolerance: float = 0.4,
        lr_scaling: str | None = None,
        batch_size_multiple: int | str = "auto",
    ) -> None:
        batch_lr_scaling = renamed_argument(
            "HeteroBatchCallback", "lr_scaling", "batch_lr_scaling", lr_scaling, batch_lr_scaling
        )
        check_settings(
            global_batch_size=global_batch_size,
            initial_batch_sizes=initial_batch_sizes,
            min_batch_size=min_batch_size,
            max_batch_size=max_batch_size,
            deadband=deadband,
            smoothing=smoothing,
            adjust_every_n_steps=adjust_every_n_steps,
            batch_lr_scaling=batch_lr_scaling,
            rollback_tolerance=rollback_tolerance,
            change_tolerance=change_tolerance,
            memory_caps=memory_caps,
            batch_size_multiple=batch_size_multiple,
        )
        self.batch_size_multiple = batch_size_multiple
        self.global_batch_size = global_batch_size
        self.initial_batch_sizes = None if initial_batch_sizes is None else tuple(initial_batch_sizes)
        self.min_batch_size, self.max_batch_size = min_batch_size, max_batch_size
        self.memory_caps = memory_caps
        self.deadband, self.adjust_every_n_steps = deadband, adjust_every_n_steps
        self.batch_lr_scaling = batch_lr_scaling
        self.seed, self.verbose = seed, verbose
        self.rollback_tolerance, self.change_tolerance = rollback_tolerance, change_tolerance
        self.warmup_steps = warmup_steps
        self.meter = ThroughputMeter(smoothing=smoothing, warmup_steps=warmup_steps)
        self.timer = ComputeTimer()
        self.busy = BusyTimer()
        self.exclusion = WaitExclusion(self.busy)
        self._pending = PendingSteps()
        #: the decisions, built with the train loader (the global batch depends on its ``batch_size``)
        self.tuner: SplitTuner | None = None
        self.sampler: HeteroBatchSampler | None = None
        self._rank, self._world_size, self._device = 0, 1, torch.device("cpu")
        self._floor = 1  # samples a rank needs per step (2 with BatchNorm)
        self._share = 1.0
        self._loss_weight: float | None = None  # what this rank back-propagates from its loss (None: the strategy's)
        self._local_batch_size = 0
        self._marks: ComputeEndMarks | None = None  # built at fit start, from the timer in place then
        self._loader_global_batch: int | None = None  # the loader's batch_size x world size
        self._lr_scale_applied = False
        self._restored: dict[str, Any] | None = None
        self._step_split: tuple[int, ...] | None = None
        self._quota_source: Callable[[], float | None] | None = None
        self._memory: MemoryGuard | None = None  # memory_caps="auto"
        self._recompiles: RecompileWatch | None = None
        self._first_epoch: int | None = None  # a new tuner's first epoch adjusts early too (not a restored one)

    @property
    def batch_sizes(self) -> tuple[int, ...] | None:
        """The newest split, one size per rank (``None`` before the train loader is built)."""
        return None if self.tuner is None else self.tuner.split

    @property
    def history(self) -> list[dict[str, Any]]:
        """One entry per applied change of split: ``step``, ``epoch``, ``from``, ``to``, ``reason`` and more."""
        return [] if self.tuner is None else self.tuner.history

    def __getattr__(self, name: str) -> Any:
        # the tuner's parts and figures were the callback's attributes before issue 24: served for one more release
        if name not in MOVED_TO_TUNER:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        warn_renamed(f"HeteroBatchCallback.{name}", f"HeteroBatchCallback.tuner.{name}")
        tuner = self.__dict__.get("tuner")
        return None if tuner is None else getattr(tuner, name)

    # ------------------------------------------------------------------ setup

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._rank, self._world_size = trainer.global_rank, trainer.world_size
        check_trainer(trainer, pl_module, self.memory_caps)
        if self.initial_batch_sizes is not None and len(self.initial_batch_sizes) != self._world_size:
            n = len(self.initial_batch_sizes)
            raise ValueError(f"initial_batch_sizes has {n} entries but the world size is {self._world_size}")
        self._floor = model_floor(pl_module, self.min_batch_size)
        self._device, self._recompiles = trainer.strategy.root_device, RecompileWatch(self._rank)
        if self.memory_caps == "auto":
            self._memory = auto_memory_guard(self._rank, self._world_size, self._device, lambda: self._local_batch_size)
        rebuild_train_dataloader(trainer, self._rebuild_loader)

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        strategy = trainer.strategy
        # the strategy weights gradients and marks the end of compute, or the loss's gradient hook does (`aggregation`)
        # accumulating, each micro-batch weighs its loss (`accumulation`) and the strategy averages, as DDP does
        own = isinstance(strategy, HeteroBatchStrategy) and trainer.accumulate_grad_batches == 1
        self._loss_weight = None if own else 1.0
        self._marks = ComputeEndMarks(self.timer, self.busy)
        if isinstance(self.busy.step_clock, HostClock):  # CUDA: events on the compute stream (see `step_clock`)
            self.busy.step_clock = step_clock_for(pl_module.device)
        warn_shared_devices(strategy, pl_module.device, self.busy)
        if isinstance(strategy, HeteroBatchStrategy):
            strategy.attach_hetero_batches(self._marks, lambda: self._share if own else 1 / self._world_size)
        elif isinstance(strategy.model, DistributedDataParallel):
            self.exclusion.exclude_buffer_broadcast(strategy.model)
        self.exclusion.exclude_strategy_collectives(strategy)
        if self._memory is not None:
            self._memory.install(strategy, pl_module)
        # a CPU quota (CFS) lets a waiting rank look fast: its steps are costed at the quota's rate (`sustained_step_s`)
        self._quota_source = quota_source(trainer.callbacks, self.busy)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._first_epoch = trainer.current_epoch if self.tuner is not None and self.tuner.costs is None else None
        if self.sampler is not None:  # the cadence chosen for these epochs, once per fit
            first, lock_step = self._first_epoch is not None, _in_lock_step(trainer.strategy)
            cadence = describe(len(self.sampler), self.adjust_every_n_steps, self.warmup_steps, first, lock_step)
            rank_zero_info(f"HeteroBatchCallback: adjusts the split {cadence}")
        # once per run (the checkpoint remembers it): the train loader, built by now, fixed both global batches
        if self._lr_scale_applied or self.tuner is None or self._loader_global_batch is None:
            return
        factor = lr_scale_factor(
            self.batch_lr_scaling, self._loader_global_batch, self.tuner.controller.global_batch_size
        )
        scale_learning_rates(trainer.optimizers, [c.scheduler for c in trainer.lr_scheduler_configs], factor)
        self._lr_scale_applied = True

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.exclusion.remove(trainer.strategy)
        MemoryGuard.remove(trainer.strategy)

    def _rebuild_loader(self, dataloader: Any) -> torch.utils.data.DataLoader:
        start = starting_batch_size(dataloader)
        self._loader_global_batch = start * self._world_size
        global_batch = self.global_batch_size or (
            sum(self.initial_batch_sizes) if self.initial_batch_sizes else self._loader_global_batch
        )
        if self.tuner is None or self.tuner.controller.global_batch_size != global_batch:
            self.tuner = self._new_tuner(global_batch)
        loader = build_hetero_loader(dataloader, self.tuner.plan, rank=self._rank, seed=self.seed, min_size=self._floor)
        self.sampler = loader.sampler  # type: ignore[assignment]
        return loader

    def _new_tuner(self, global_batch: int) -> SplitTuner:
        tuner = new_tuner(self, global_batch, self._rank, self._world_size, self._device.type, self._floor)
        if self._memory is not None:  # chunks within a memory cap in multiples of batch_size_multiple too
            self._memory.caps.multiple = tuner.controller.multiple
        if self._restored is not None:
            tuner.load_state_dict(self._restored)
            self._restored = None
        return tuner

    # ------------------------------------------------------------------ per step

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        assert self.sampler is not None and self.tuner is not None
        quota = None if self._quota_source is None else self._quota_source()
        span = self.busy.close_step()  # read when its clock has it (CUDA events: once the device got there)
        if span is not None and self._step_split is not None:
            # a step's sustained cost is at least its CPU time at the quota's rate (see `sustained_step_s`)
            self._pending.add(self._step_split, span, sustained_step_s(0.0, self.busy.last_cpu_s, quota))
        sizes = tuple(self.sampler.next_sizes())
        if self._step_split is not None and sizes != self._step_split:
            self._pending.skip_next()  # the first step at a new split pays for it (allocator, caches)
        self._pending.feed(self.tuner)
        self._step_split = sizes
        self._local_batch_size = sizes[self._rank]
        mark_batch_dynamic(batch, self._local_batch_size)  # torch.compile: one graph for the changing sizes
        self._share = batch_share(sizes, self._rank)
        if self._loss_weight is not None:
            epoch, sampler = self.sampler.epoch, self.sampler
            self._loss_weight = step_weight(
                sizes, self._rank, batch_idx, trainer.accumulate_grad_batches, len(sampler),
                lambda step: sum(sampler.sizes_at(epoch, step)),
            )  # fmt: skip
        self.timer.start()

    @override
    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        if self._loss_weight is not None and self._marks is not None:
            weight_backward(loss, self._loss_weight, self._marks.mark_compute_end)

    @override
    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.busy.close_ready()  # DDP returns from backward once the gradient all-reduce is done: that was a wait

    @override
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        self.busy.close_ready()  # AsyncPSStrategy in BSP all-reduces after backward, before this hook

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        close_compute_window(self.timer, self.meter, self._local_batch_size)
        assert self.sampler is not None
        first = trainer.current_epoch == self._first_epoch
        after = adjusts_after(batch_idx + 1, len(self.sampler), self.adjust_every_n_steps, self.warmup_steps, first)
        if after and _in_lock_step(trainer.strategy):
            self._adjust(trainer, epoch_end=False)

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.busy.skip()  # a validation run inside the epoch is not part of any training step's cost

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.busy.skip()  # the step across the epoch boundary pays for epoch-end work: not measured
        self._adjust(trainer, epoch_end=True)

    def _adjust(self, trainer: L.Trainer, epoch_end: bool) -> None:
        tuner, sampler = self.tuner, self.sampler
        assert tuner is not None and sampler is not None
        self._pending.feed(tuner, wait=True)
        memory = self._memory
        if self._recompiles is not None:
            self._recompiles.check()  # warns once, naming the rank, past RECOMPILE_BOUND graphs
        row = tuner.close_period(sampler.produced_position, None if memory is None else memory.caps.own)
        seen = read_rows(gather_rows(trainer.strategy, row, self.busy))
        decision = tuner.adjust(seen, step=trainer.global_step, epoch=trainer.current_epoch)
        if memory is not None:  # every rank splits within every rank's cap
            memory.caps.read(seen.memory_caps)
            decision = respect_caps(decision, tuner.split, tuner.controller, memory.caps.all)
        if decision is None:
            return
        predicted = tuner.predicted_step_s()  # at the split measured, before the decision
        if decision.apply:
            position = seen.position + 1
            if epoch_end:
                position = max(position, sampler.position(trainer.current_epoch + 1, 0))
            tuner.plan.change_at(position, decision.sizes)
            self.meter.restart_warmup(1)
        metrics = adjustment_metrics(predicted, tuner.sync_step_s, tuner.split)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    # ------------------------------------------------------------------ summary and state

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.verbose and trainer.is_global_zero and self.tuner is not None:
            rank_zero_info(self.summary())

    def summary(self) -> str:
        """A one-screen table (see :func:`~lightning_hetero.hetero_batch.tuner.format_summary`)."""
        assert self.tuner is not None
        return self.tuner.summary()

    @override
    def state_dict(self) -> dict[str, Any]:
        state = {"split": None, "history": []} if self.tuner is None else self.tuner.state_dict()
        return {**state, "lr_scale_applied": self._lr_scale_applied, **saved_caps(self._memory)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored = state_dict
        restore_caps(self._memory, state_dict)  # memory_caps="auto" (set up before Lightning restores callbacks)
        self._lr_scale_applied = state_dict.get("lr_scale_applied", False)
        self.tuner = None  # rebuilt from the restored state with the train loader


def _in_lock_step(strategy: object) -> bool:
    # Ranks of an asynchronous strategy (AsyncPSStrategy in ASP) are not in lock-step inside an epoch: exchanging
    # measurements there would make fast ranks wait, so the split changes only at epoch ends.
    return not isinstance(strategy, HeteroBatchStrategy) or strategy.in_lock_step
