"""``HeteroBatchCallback``: Lightning glue that feeds the controller and applies its splits.

The arithmetic lives elsewhere (``controller``, ``sampler``, ``aggregation``, ``lr_scaling``,
:mod:`lightning_hetero.measurement`); this module wires it to Trainer hooks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_info
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from lightning_hetero._deprecation import renamed_argument
from lightning_hetero._lightning_internals import rebuild_train_dataloader
from lightning_hetero.batch_weighting import averaged_weight, batch_share
from lightning_hetero.contracts import HeteroBatchStrategy
from lightning_hetero.hetero_batch.aggregation import weight_backward
from lightning_hetero.hetero_batch.controller import AdjustmentPolicy, BatchSizeController
from lightning_hetero.hetero_batch.cost_model import PeriodCostModel
from lightning_hetero.hetero_batch.exchange import gather_rows, own_row, read_rows, trimmed
from lightning_hetero.hetero_batch.loader import build_hetero_loader, starting_batch_size
from lightning_hetero.hetero_batch.lr_scaling import lr_scale_factor, scale_learning_rates
from lightning_hetero.hetero_batch.period import MeasuredPeriod
from lightning_hetero.hetero_batch.sampler import HeteroBatchSampler, SplitPlan
from lightning_hetero.hetero_batch.settings import check_settings
from lightning_hetero.hetero_batch.summary import adjustment_metrics, format_summary
from lightning_hetero.hetero_batch.window import ComputeEndMarks, WaitExclusion, quota_source
from lightning_hetero.measurement import (
    BusyTimer,
    ComputeTimer,
    ThroughputMeter,
    close_compute_window,
    sustained_step_s,
)


class HeteroBatchCallback(Callback):
    """Resize each rank's share of every global batch in proportion to its measured compute throughput.

    Each rank measures its *busy* time per step (wall time minus every wait for other ranks, see
    :mod:`~lightning_hetero.hetero_batch.window`; under a CPU quota at least its CPU time at the quota's rate) and fits
    it per adjustment period as a fixed overhead plus a per-sample cost
    (:class:`~lightning_hetero.hetero_batch.cost_model.PeriodCostModel`). At each adjustment all ranks exchange their
    fits and the measured synchronous step (:mod:`~lightning_hetero.hetero_batch.exchange`) and apply the same
    decision (:class:`~lightning_hetero.hetero_batch.controller.AdjustmentPolicy`): the split that equalises their
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
        memory_caps: optional per-rank largest batch that fits in memory.
        deadband: apply a new split only when it is predicted to shorten the synchronous step by more than this
            fraction (a cluster-wide decision); a smaller gain beyond 2% and the measurement noise, proposed at two
            adjustments in a row, is applied too (a refinement, see
            :class:`~lightning_hetero.hetero_batch.controller.AdjustmentPolicy`).
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
            only at epoch ends.
        batch_lr_scaling: ``"linear"`` or ``"sqrt"`` to rescale learning rates when ``global_batch_size`` differs
            from the loader's ``batch_size`` x world size; ``None`` leaves them alone. (Not to be confused with
            ``AsyncPSStrategy(lr_scaling=...)``, which scales each update by its staleness.)
        seed: seeds the per-epoch permutation, identically on every rank.
        verbose: print the end-of-fit summary on rank 0.

    Notes:
        - Works with ``strategy="ddp"`` (any DDP launcher; CPU/gloo and CUDA/NCCL), with single-device training,
          and with strategies that offer :class:`~lightning_hetero.contracts.HeteroBatchStrategy` such as
          :class:`~lightning_hetero.AsyncPSStrategy`.
        - The model's loss must be a mean over the local batch (the usual reduction), so that weighting by
          ``b_k / Σ b`` yields the big-batch mean. Batch norm sees per-rank batches of different sizes.
        - Collectives called directly through ``torch.distributed`` (not through the strategy) are not seen and
          count as the rank's own busy time.
        - Gradient accumulation is not supported (``accumulate_grad_batches`` must be 1).
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
        memory_caps: Sequence[int | None] | None = None,
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
        )
        self.global_batch_size = global_batch_size
        self.initial_batch_sizes = None if initial_batch_sizes is None else tuple(initial_batch_sizes)
        self.min_batch_size = min_batch_size
        self.max_batch_size = max_batch_size
        self.memory_caps = memory_caps
        self.deadband = deadband
        self.adjust_every_n_steps = adjust_every_n_steps
        self.batch_lr_scaling = batch_lr_scaling
        self.seed = seed
        self.verbose = verbose
        self.rollback_tolerance = rollback_tolerance
        self.warmup_steps = warmup_steps
        self.meter = ThroughputMeter(smoothing=smoothing, warmup_steps=warmup_steps)
        self.cost = PeriodCostModel(change_tolerance=change_tolerance)
        #: every rank's (overhead_s, per_sample_s) at the last exchange
        self.costs: tuple[tuple[float, float], ...] | None = None
        #: every rank's mean busy seconds per step at its current batch size, at the last exchange
        self.busy_s: tuple[float, ...] | None = None
        #: the synchronous step (wall seconds per step at the current split) measured in the last period
        self.sync_step_s: float | None = None
        self.timer = ComputeTimer()
        self.busy = BusyTimer()
        self.controller: BatchSizeController | None = None
        self.policy: AdjustmentPolicy | None = None
        self.plan: SplitPlan | None = None
        self.sampler: HeteroBatchSampler | None = None
        self.throughputs: tuple[float, ...] | None = None
        self.history: list[dict[str, Any]] = []
        self._rank = 0
        self._world_size = 1
        self._share = 1.0
        self._loss_weight: float | None = None  # what this rank back-propagates from its loss (None: the strategy's)
        self._local_batch_size = 0
        self._marks: ComputeEndMarks | None = None  # built at fit start, from the timer in place then
        self._lr_scale_applied = False
        self._restored: dict[str, Any] | None = None
        self._fit_trainer: L.Trainer | None = None
        self._step_split: tuple[int, ...] | None = None
        self.period = MeasuredPeriod(skip=warmup_steps)
        self.exclusion = WaitExclusion(self.busy)
        self._quota_source: Callable[[], float | None] | None = None

    @property
    def batch_sizes(self) -> tuple[int, ...] | None:
        """The newest split, one size per rank (``None`` before the train loader is built)."""
        return None if self.plan is None else self.plan.current

    # ------------------------------------------------------------------ setup

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._fit_trainer = trainer
        self._rank, self._world_size = trainer.global_rank, trainer.world_size
        if trainer.accumulate_grad_batches != 1:
            raise ValueError(
                "HeteroBatchCallback does not support gradient accumulation: set Trainer(accumulate_grad_batches=1)"
            )
        if not pl_module.automatic_optimization:
            raise ValueError("HeteroBatchCallback needs automatic optimization (self.automatic_optimization = True)")
        strategy = trainer.strategy
        if self._world_size > 1 and not isinstance(strategy, (DDPStrategy, HeteroBatchStrategy)):
            raise ValueError(
                f"HeteroBatchCallback supports strategy='ddp' (and strategies offering HeteroBatchStrategy), "
                f"not {type(strategy).__name__}"
            )
        if self.initial_batch_sizes is not None and len(self.initial_batch_sizes) != self._world_size:
            raise ValueError(
                f"initial_batch_sizes has {len(self.initial_batch_sizes)} entries but the world size is "
                f"{self._world_size}"
            )
        rebuild_train_dataloader(trainer, self._rebuild_loader)

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        strategy = trainer.strategy
        # the strategy weights gradients and marks the end of compute, or the loss's gradient hook does (`aggregation`)
        self._loss_weight = None if isinstance(strategy, HeteroBatchStrategy) else 1.0
        self._marks = ComputeEndMarks(self.timer, self.busy)
        if isinstance(strategy, HeteroBatchStrategy):
            strategy.attach_hetero_batches(self._marks, lambda: self._share)
        elif isinstance(strategy.model, DistributedDataParallel):
            self.exclusion.exclude_buffer_broadcast(strategy.model)
        self.exclusion.exclude_strategy_collectives(strategy)
        # A CPU quota (CFS) lets a rank that waits look fast: cost its steps at the quota's rate (see
        # `sustained_step_s`).
        self._quota_source = quota_source(trainer.callbacks, self.busy)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.exclusion.remove(trainer.strategy)

    def _rebuild_loader(self, dataloader: Any) -> torch.utils.data.DataLoader:
        start = starting_batch_size(dataloader)
        base_global = start * self._world_size
        global_batch = self.global_batch_size or (
            sum(self.initial_batch_sizes) if self.initial_batch_sizes else base_global
        )
        if self.initial_batch_sizes is not None and sum(self.initial_batch_sizes) != global_batch:
            raise ValueError(
                f"initial_batch_sizes sum to {sum(self.initial_batch_sizes)}, not the global batch {global_batch}"
            )
        self.controller = BatchSizeController(
            global_batch,
            self._world_size,
            min_batch_size=self.min_batch_size,
            max_batch_size=self.max_batch_size,
            memory_caps=self.memory_caps,
            deadband=self.deadband,
        )
        if self.policy is None or self.policy.controller.global_batch_size != global_batch:
            self.policy = AdjustmentPolicy(self.controller, rollback_tolerance=self.rollback_tolerance)
        else:
            self.policy.controller = self.controller
        if self.plan is None:
            self.plan = SplitPlan(self._starting_split(global_batch))
        if not self._lr_scale_applied:
            factor = lr_scale_factor(self.batch_lr_scaling, base_global, global_batch)
            trainer = self._fit_trainer
            assert trainer is not None
            scale_learning_rates(trainer.optimizers, [c.scheduler for c in trainer.lr_scheduler_configs], factor)
            self._lr_scale_applied = True
        loader = build_hetero_loader(dataloader, self.plan, rank=self._rank, seed=self.seed)
        self.sampler = loader.sampler  # type: ignore[assignment]
        return loader

    def _starting_split(self, global_batch: int) -> tuple[int, ...]:
        assert self.controller is not None
        restored = self._restored
        if restored is not None:
            split = tuple(restored["split"])
            if len(split) != self._world_size or sum(split) != global_batch:
                raise ValueError(
                    f"the checkpoint's split {split} does not fit this run ({self._world_size} ranks, global batch "
                    f"{global_batch}); resume with the same devices and batch size"
                )
            if restored.get("throughputs"):
                self.throughputs = tuple(restored["throughputs"])
            if restored.get("costs"):
                self.costs = tuple(tuple(c) for c in restored["costs"])
                self.cost.overhead_s, self.cost.per_sample_s = self.costs[self._rank]
            if restored.get("policy") and self.policy is not None:
                self.policy.load_state_dict(restored["policy"])
            return split
        if self.initial_batch_sizes is not None:
            return self.initial_batch_sizes
        return self.controller.equal_split()

    # ------------------------------------------------------------------ per step

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        assert self.sampler is not None
        quota = None if self._quota_source is None else self._quota_source()
        busy_s = self.busy.step_start()
        wall_s = self.busy.last_wall_s
        if busy_s is not None and wall_s is not None and self._step_split is not None:
            # a step's sustained cost is at least its CPU time at the quota's rate (see `sustained_step_s`)
            floor = sustained_step_s(0.0, self.busy.last_cpu_s, quota)
            self.period.record(self._step_split, self._rank, busy_s, floor, wall_s)
        sizes = tuple(self.sampler.next_sizes())
        if self._step_split is not None and sizes != self._step_split:
            self.period.skip_next()  # the first step at a new split pays for it (allocator, caches)
        self._step_split = sizes
        self._local_batch_size = sizes[self._rank]
        self._share = batch_share(sizes, self._rank)
        if self._loss_weight is not None:
            self._loss_weight = averaged_weight(sizes, self._rank)
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
        n = self.adjust_every_n_steps
        assert self.sampler is not None
        mid_epoch = n is not None and (batch_idx + 1) % n == 0 and batch_idx + 1 < len(self.sampler)
        if mid_epoch and _in_lock_step(trainer.strategy):
            self._adjust(trainer, epoch_end=False)

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.busy.skip()  # a validation run inside the epoch is not part of any training step's cost

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.busy.skip()  # the step across the epoch boundary pays for epoch-end work: not measured
        self._adjust(trainer, epoch_end=True)

    def _adjust(self, trainer: L.Trainer, epoch_end: bool) -> None:
        assert self.sampler is not None and self.plan is not None and self.controller is not None
        assert self.policy is not None
        current = self.plan.current
        steps, measured, period_walls = self.period.close(current, self._rank)
        report = self.cost.update(steps)
        fit = (self.cost.overhead_s, self.cost.per_sample_s, len(self.cost.sizes))
        local = own_row(
            fit,
            self.cost.latest_fit(),
            report.changed,
            self.sampler.produced_position,
            measured,
            trimmed(self.period.sync_walls),
            trimmed(period_walls),
            self.cost.relative_error(current[self._rank]),
        )
        seen = read_rows(gather_rows(trainer.strategy, local, self.busy))
        if any(seen.changed):
            # a rank saw its speed change: every rank restarts from the same (newest) period
            self.period.restart_sync(current, period_walls)
            if not report.changed:
                self.cost.restart_from_latest()
        if seen.costs is None:
            return
        self.costs = seen.costs
        self.sync_step_s = seen.sync_step_s
        if all(math.isfinite(b) for b in seen.busy_s):
            self.busy_s = seen.busy_s
        self.throughputs = tuple(b / (a + c * b) for b, (a, c) in zip(current, self.costs, strict=True))
        decision = self.policy.decide(
            current,
            self.costs,
            self.sync_step_s,
            known_sizes=seen.known_sizes,
            sync_steps=seen.sync_steps,
            relative_errors=seen.relative_errors,
        )
        predicted = self.predicted_step_s()  # at the split measured, before the decision
        if decision.apply:
            position = seen.position + 1
            if epoch_end:
                position = max(position, self.sampler.position(trainer.current_epoch + 1, 0))
            self.plan.change_at(position, decision.sizes)
            self.meter.restart_warmup(1)
            self.history.append(
                {
                    "step": trainer.global_step,
                    "epoch": trainer.current_epoch,
                    "from": current,
                    "to": decision.sizes,
                    "reason": decision.reason,
                    "costs": self.costs,
                    "sync_step_s": self.sync_step_s,
                    "changed": list(seen.changed),
                }
            )
        metrics = adjustment_metrics(predicted, self.sync_step_s, self.plan.current)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    def predicted_step_s(self, split: Sequence[int] | None = None) -> tuple[float, ...]:
        """Each rank's predicted busy seconds per step at ``split`` (default: the current one), from the last fits."""
        if self.costs is None or self.plan is None:
            return ()
        split = self.plan.current if split is None else split
        return tuple(a + c * b for b, (a, c) in zip(split, self.costs, strict=True))

    # ------------------------------------------------------------------ summary and state

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.verbose and trainer.is_global_zero and self.plan is not None:
            rank_zero_info(self.summary())

    def summary(self) -> str:
        """A one-screen table (see :func:`~lightning_hetero.hetero_batch.summary.format_summary`)."""
        assert self.plan is not None and self.controller is not None
        predicted = self.predicted_step_s()
        equal = self.predicted_step_s(self.controller.equal_split()) if predicted else None
        return format_summary(self.plan.current, predicted, self.busy_s, self.history, self.sync_step_s, equal)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "split": None if self.plan is None else list(self.plan.current),
            "throughputs": None if self.throughputs is None else list(self.throughputs),
            "costs": None if self.costs is None else [list(c) for c in self.costs],
            "policy": None if self.policy is None else self.policy.state_dict(),
            "lr_scale_applied": self._lr_scale_applied,
            "history": self.history,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored = state_dict if state_dict.get("split") else None
        self._lr_scale_applied = state_dict.get("lr_scale_applied", False)
        self.history = list(state_dict.get("history", []))
        self.plan = None


def _in_lock_step(strategy: object) -> bool:
    # Ranks of an asynchronous strategy (AsyncPSStrategy in ASP) are not in lock-step inside an epoch: exchanging
    # measurements there would make fast ranks wait, so the split changes only at epoch ends.
    return not isinstance(strategy, HeteroBatchStrategy) or strategy.in_lock_step
