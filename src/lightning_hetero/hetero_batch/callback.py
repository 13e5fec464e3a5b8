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

from lightning_hetero._validation import check_finite
from lightning_hetero.batch_weighting import batch_share
from lightning_hetero.contracts import HeteroBatchStrategy
from lightning_hetero.emulation.slowdown import SlowdownEmulator
from lightning_hetero.hetero_batch.aggregation import BatchWeightState, register_batch_weighted_hook
from lightning_hetero.hetero_batch.controller import AdjustmentPolicy, BatchSizeController
from lightning_hetero.hetero_batch.cost_model import PeriodCostModel
from lightning_hetero.hetero_batch.loader import build_hetero_loader, starting_batch_size
from lightning_hetero.hetero_batch.lr_scaling import LR_SCALING_RULES, lr_scale_factor, scale_learning_rates
from lightning_hetero.hetero_batch.sampler import HeteroBatchSampler, SplitPlan
from lightning_hetero.measurement import (
    BusyTimer,
    ComputeTimer,
    ThroughputMeter,
    cgroup_cpu_quota,
    sustained_step_s,
)

#: strategy methods that run collectives; time spent in them is waiting for other ranks, not this rank's cost
_COLLECTIVES = ("reduce", "all_gather", "broadcast", "barrier")


class HeteroBatchCallback(Callback):
    """Resize each rank's share of every global batch in proportion to its measured compute throughput.

    Each rank measures its *busy* time per step (wall time between step starts minus every wait for other ranks:
    the gradient all-reduce, DDP's buffer broadcast, ``sync_dist`` logging and other strategy collectives), so a
    CPU quota's throttling counts wherever it lands; under a CPU quota (read from the cgroup, or from a CFS
    :class:`~lightning_hetero.SlowdownEmulator`) a step costs at least its CPU time at the quota's rate. It fits it per adjustment period as a fixed overhead plus a
    per-sample cost (:class:`~lightning_hetero.hetero_batch.cost_model.PeriodCostModel`). At each adjustment all
    ranks exchange their fits and the measured synchronous step, and apply the same decision
    (:class:`~lightning_hetero.hetero_batch.controller.AdjustmentPolicy`): the split that makes their predicted
    step times equal, never giving a slower rank more samples than a faster one, rolled back if the synchronous
    step measured after it is slower than before.
    The global batch stays exactly constant, every sample is used once per epoch, every rank does the same number
    of steps, and gradients are combined as the batch-weighted mean ``Σ b_k g_k / Σ b_k``, so the optimisation is
    that of one big batch. The train loader's ``batch_size`` is the starting per-rank size.

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
            fraction (a cluster-wide decision).
        smoothing: EWMA weight of the newest compute-window throughput in ``meter`` (which
            :class:`~lightning_hetero.switching.SyncSwitchCallback` reads); the split itself follows busy times.
        warmup_steps: measurements discarded at the start of fit (and one after each change of split).
        rollback_tolerance: a change of split is undone when the synchronous step measured after it is slower than
            the one measured before it by more than this fraction.
        change_tolerance: a rank whose measured busy time misses its model's prediction by more than this fraction
            forgets its older measurements (its speed changed, or the model was wrong) and starts again from the
            newest period.
        adjust_every_n_steps: also adjust every ``n`` optimizer steps inside an epoch; by default the split changes
            only at epoch ends.
        lr_scaling: ``"linear"`` or ``"sqrt"`` to rescale learning rates when ``global_batch_size`` differs from
            the loader's ``batch_size`` x world size; ``None`` leaves them alone.
        seed: seeds the per-epoch permutation, identically on every rank.
        verbose: print the end-of-fit summary on rank 0.

    Notes:
        - Works with ``strategy="ddp"`` (any DDP launcher; CPU/gloo and CUDA/NCCL), with single-device training,
          and with strategies that offer :class:`~lightning_hetero.contracts.HeteroBatchStrategy` such as
          :class:`~lightning_hetero.AsyncPSStrategy`.
        - The model's loss must be a mean over the local batch (the usual reduction), so that weighting by
          ``b_k / Σ b`` yields the big-batch mean. Batch norm sees per-rank batches of different sizes.
        - Waiting in collectives that go through the strategy (``self.log(..., sync_dist=True)``, barriers), in
          DDP's buffer broadcast and in the gradient all-reduce is excluded from a rank's busy time. Collectives
          called directly through ``torch.distributed`` are not seen and count as the rank's own time.
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
        lr_scaling: str | None = None,
        seed: int = 0,
        verbose: bool = True,
        rollback_tolerance: float = 0.15,
        change_tolerance: float = 0.4,
    ) -> None:
        for name, value in (("min_batch_size", min_batch_size), ("max_batch_size", max_batch_size)):
            values = [value] if isinstance(value, int) else list(value or [])
            if any(v < 1 for v in values):
                raise ValueError(f"{name} must be positive, got {value}")
        if isinstance(min_batch_size, int) and isinstance(max_batch_size, int) and min_batch_size > max_batch_size:
            raise ValueError(f"min_batch_size ({min_batch_size}) must not exceed max_batch_size ({max_batch_size})")
        if global_batch_size is not None and global_batch_size < 1:
            raise ValueError(f"global_batch_size must be positive, got {global_batch_size}")
        if initial_batch_sizes is not None and any(b < 1 for b in initial_batch_sizes):
            raise ValueError(f"initial_batch_sizes must all be positive, got {list(initial_batch_sizes)}")
        if adjust_every_n_steps is not None and adjust_every_n_steps < 1:
            raise ValueError(f"adjust_every_n_steps must be a positive int or None, got {adjust_every_n_steps}")
        check_finite(deadband=deadband, smoothing=smoothing)
        if deadband < 0:
            raise ValueError(f"deadband must be >= 0, got {deadband}")
        if lr_scaling is not None and lr_scaling not in LR_SCALING_RULES:
            raise ValueError(f"lr_scaling must be one of {LR_SCALING_RULES} or None, got {lr_scaling!r}")
        for name, value in (("rollback_tolerance", rollback_tolerance), ("change_tolerance", change_tolerance)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if change_tolerance == 0:
            raise ValueError("change_tolerance must be > 0 (0 would forget every measurement each period)")
        self.global_batch_size = global_batch_size
        self.initial_batch_sizes = None if initial_batch_sizes is None else tuple(initial_batch_sizes)
        self.min_batch_size = min_batch_size
        self.max_batch_size = max_batch_size
        self.memory_caps = memory_caps
        self.deadband = deadband
        self.adjust_every_n_steps = adjust_every_n_steps
        self.lr_scaling = lr_scaling
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
        self._local_batch_size = 0
        self._gradients_hooked = False
        self._lr_scale_applied = False
        self._restored: dict[str, Any] | None = None
        self._trainer: L.Trainer | None = None
        self._to_skip = warmup_steps
        self._step_split: tuple[int, ...] | None = None
        #: this period's measured steps: (split in force, this rank's batch, busy s, floor s, wall s)
        self._period: list[tuple[tuple[int, ...], int, float, float, float]] = []
        self._handles: list[Any] = []
        self._wrapped: list[str] = []
        self._forward_started: float | None = None
        self._quota_source: Callable[[], float | None] | None = None

    @property
    def batch_sizes(self) -> tuple[int, ...] | None:
        """The newest split, one size per rank (``None`` before the train loader is built)."""
        return None if self.plan is None else self.plan.current

    # ------------------------------------------------------------------ setup

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._trainer = trainer
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
        _wrap_train_data_source(trainer, self._rebuild_loader)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        strategy = trainer.strategy
        marks = _ComputeEndMarks(self.timer, self.busy)
        if isinstance(strategy, HeteroBatchStrategy):
            strategy.attach_hetero_batches(marks, lambda: self._share)
            self._gradients_hooked = True
        elif isinstance(strategy.model, DistributedDataParallel):
            state = BatchWeightState(share=lambda: self._share, timer=marks)
            register_batch_weighted_hook(strategy.model, state)
            self._gradients_hooked = True
            self._exclude_buffer_broadcast(strategy.model)
        self._exclude_strategy_collectives(strategy)
        # A CPU quota (CFS) lets a rank that waits look fast: cost its steps at the quota's rate (see
        # `sustained_step_s`). The quota comes from an in-process CFS emulator when there is one, else the cgroup.
        emulators = [cb for cb in trainer.callbacks if isinstance(cb, SlowdownEmulator) and cb.throttle == "cfs"]
        if emulators:
            self._quota_source = lambda: emulators[0].cpu_quota
            self.busy.cpu_clock = emulators[0].cpu_clock
        else:
            quota = cgroup_cpu_quota()
            self._quota_source = lambda: quota

    def _cpu_quota(self) -> float | None:
        return None if self._quota_source is None else self._quota_source()

    def _exclude_buffer_broadcast(self, ddp: DistributedDataParallel) -> None:
        # DDP broadcasts buffers (BatchNorm statistics) from rank 0 inside its forward, before it calls the wrapped
        # module: the time between the two forward pre-hooks is waiting for rank 0, not this rank's compute.
        def outer(*_: Any) -> None:
            self._forward_started = self.busy.clock()

        def inner(*_: Any) -> None:
            if self._forward_started is not None:
                self.busy.add_wait(self.busy.clock() - self._forward_started)
                self._forward_started = None

        self._handles += [ddp.register_forward_pre_hook(outer), ddp.module.register_forward_pre_hook(inner)]

    def _exclude_strategy_collectives(self, strategy: Any) -> None:
        # `self.log(..., sync_dist=True)`, barriers and this callback's own exchange go through these methods; an
        # instance attribute shadows the method for this fit and is removed again in teardown.
        for name in _COLLECTIVES:
            method = getattr(strategy, name, None)
            if method is None or name in vars(strategy):
                continue

            def timed(*args: Any, _method: Callable[..., Any] = method, **kwargs: Any) -> Any:
                with self.busy.waiting():
                    return _method(*args, **kwargs)

            setattr(strategy, name, timed)
            self._wrapped.append(name)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for name in self._wrapped:
            vars(trainer.strategy).pop(name, None)
        self._wrapped = []

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
            factor = lr_scale_factor(self.lr_scaling, base_global, global_batch)
            trainer = self._trainer
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

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        assert self.sampler is not None
        quota = self._cpu_quota()
        busy_s = self.busy.step_start()
        wall_s = self.busy.last_wall_s
        if busy_s is not None and wall_s is not None and self._step_split is not None:
            if self._to_skip > 0:
                self._to_skip -= 1
            else:
                # a step's sustained cost is at least its CPU time at the quota's rate (see `sustained_step_s`)
                floor = sustained_step_s(0.0, self.busy.last_cpu_s, quota)
                self._period.append((self._step_split, self._local_batch_size, busy_s, floor, wall_s))
        sizes = tuple(self.sampler.next_sizes())
        if self._step_split is not None and sizes != self._step_split:
            self._to_skip = max(self._to_skip, 1)  # the first step at a new split pays for it (allocator, caches)
        self._step_split = sizes
        self._local_batch_size = sizes[self._rank]
        self._share = batch_share(sizes, self._rank)
        self.timer.start()

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._gradients_hooked:
            self.timer.mark_compute_end()
        self.busy.close_ready()  # DDP returns from backward once the gradient all-reduce is done: that was a wait

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        self.busy.close_ready()  # AsyncPSStrategy in BSP all-reduces after backward, before this hook

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        elapsed = self.timer.elapsed_s()
        if elapsed is not None:
            self.meter.update(self._local_batch_size, elapsed)
        n = self.adjust_every_n_steps
        assert self.sampler is not None
        mid_epoch = n is not None and (batch_idx + 1) % n == 0 and batch_idx + 1 < len(self.sampler)
        if mid_epoch and _in_lock_step(trainer.strategy):
            self._adjust(trainer, epoch_end=False)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.busy.skip()  # a validation run inside the epoch is not part of any training step's cost

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.busy.skip()  # the step across the epoch boundary pays for epoch-end work: not measured
        self._adjust(trainer, epoch_end=True)

    def _adjust(self, trainer: L.Trainer, epoch_end: bool) -> None:
        assert self.sampler is not None and self.plan is not None and self.controller is not None
        assert self.policy is not None
        current = self.plan.current
        at_current = [(size, busy, floor, wall) for split, size, busy, floor, wall in self._period if split == current]
        report = self.cost.update((size, busy, floor) for _, size, busy, floor, _ in self._period)
        self._period = []
        per_sample = math.nan if self.cost.per_sample_s is None else self.cost.per_sample_s
        own_size = current[self._rank]
        mine = [(busy, floor) for size, busy, floor, _ in at_current if size == own_size]
        # as the cost model sees it: mean busy time, raised to the mean CPU-at-quota floor
        measured = max(sum(b for b, _ in mine), sum(f for _, f in mine)) / len(mine) if mine else math.nan
        # the synchronous step at this split, without the period's longest step (a stall is not the split's doing)
        walls = sorted(wall for *_, wall in at_current)[: max(1, len(at_current) - 1)] if at_current else []
        local = torch.tensor(
            [
                self.cost.overhead_s,
                per_sample,
                float(len(self.cost.sizes)),
                sum(walls) / len(walls) if walls else math.nan,
                measured,
                float(report.changed),
                float(self.sampler.produced_position),
            ],
            dtype=torch.float64,
        )
        gathered = trainer.strategy.all_gather(local).reshape(-1, 7)
        if bool(gathered[:, 5].any()):
            # a rank saw its speed change: every other one restarts from the same period, and all exchange again
            if not report.changed:
                self.cost.restart_from_latest()
                fit = [self.cost.overhead_s, math.nan if self.cost.per_sample_s is None else self.cost.per_sample_s]
                local[:3] = torch.tensor([*fit, float(len(self.cost.sizes))], dtype=torch.float64)
            gathered = trainer.strategy.all_gather(local).reshape(-1, 7)
        if torch.isnan(gathered[:, :2]).any():
            return
        self.costs = tuple((float(a), float(c)) for a, c in gathered[:, :2].tolist())
        walls_s = [w for w in gathered[:, 3].tolist() if math.isfinite(w)]
        self.sync_step_s = max(walls_s) if len(walls_s) == self._world_size else None
        busy = tuple(float(b) for b in gathered[:, 4])
        if all(math.isfinite(b) for b in busy):
            self.busy_s = busy
        self.throughputs = tuple(b / (a + c * b) for b, (a, c) in zip(current, self.costs, strict=True))
        decision = self.policy.decide(
            current, self.costs, self.sync_step_s, known_sizes=[int(n) for n in gathered[:, 2].tolist()]
        )
        metrics = {f"hetero/predicted_step_ms_rank{k}": 1e3 * t for k, t in enumerate(self.predicted_step_s())}
        if self.sync_step_s is not None:
            metrics["hetero/sync_step_ms"] = 1e3 * self.sync_step_s
        if decision.apply:
            position = int(gathered[:, 6].max().item()) + 1
            if epoch_end:
                position = max(position, self.sampler.position(trainer.current_epoch + 1, 0))
            self.plan.schedule(position, decision.sizes)
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
                    "changed": [bool(c) for c in gathered[:, 5].tolist()],
                }
            )
        metrics |= {f"hetero/batch_size_rank{k}": float(b) for k, b in enumerate(self.plan.current)}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    def predicted_step_s(self, split: Sequence[int] | None = None) -> tuple[float, ...]:
        """Each rank's predicted busy seconds per step at ``split`` (default: the current one), from the last fits."""
        if self.costs is None or self.plan is None:
            return ()
        split = self.plan.current if split is None else split
        return tuple(a + c * b for b, (a, c) in zip(split, self.costs, strict=True))

    # ------------------------------------------------------------------ summary and state

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.verbose and trainer.is_global_zero and self.plan is not None:
            rank_zero_info(self.summary())

    def summary(self) -> str:
        """A one-screen table: per-rank sizes, predicted and measured busy time per step, and the synchronous step.

        Times rather than samples/s: at a small batch a rank's samples/s mostly reflects its fixed cost per step
        and says little about how fast it is. The predicted step-time ratio of equal batches to the current split
        is labelled as a model prediction; the measured synchronous step is the ground truth.
        """
        assert self.plan is not None and self.controller is not None
        sizes = self.plan.current
        predicted = self.predicted_step_s()
        header = f"{'rank':>4} {'batch size':>10} {'predicted busy ms/step':>23} {'measured busy ms/step':>22}"
        lines = ["HeteroBatchCallback summary", header]
        for rank, size in enumerate(sizes):
            guess = f"{1e3 * predicted[rank]:23.1f}" if predicted else f"{'n/a':>23}"
            seen = self.busy_s[rank] if self.busy_s else math.nan
            measured = f"{1e3 * seen:22.1f}" if math.isfinite(seen) else f"{'n/a':>22}"
            lines.append(f"{rank:>4} {size:>10} {guess} {measured}")
        rollbacks = sum(1 for change in self.history if change.get("reason") == "rollback")
        lines.append(f"global batch {sum(sizes)}, split changes {len(self.history)} ({rollbacks} rolled back)")
        if self.sync_step_s is not None:
            lines.append(f"measured synchronous step at the split in force: {1e3 * self.sync_step_s:.1f} ms")
        if predicted:
            equal = max(self.predicted_step_s(self.controller.equal_split()))
            lines.append(f"predicted step-time ratio, equal batches / this split (model): {equal / max(predicted):.2f}")
        return "\n".join(lines)

    def state_dict(self) -> dict[str, Any]:
        return {
            "split": None if self.plan is None else list(self.plan.current),
            "throughputs": None if self.throughputs is None else list(self.throughputs),
            "costs": None if self.costs is None else [list(c) for c in self.costs],
            "policy": None if self.policy is None else self.policy.state_dict(),
            "lr_scale_applied": self._lr_scale_applied,
            "history": self.history,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored = state_dict if state_dict.get("split") else None
        self._lr_scale_applied = state_dict.get("lr_scale_applied", False)
        self.history = list(state_dict.get("history", []))
        self.plan = None


class _ComputeEndMarks:
    """Passed where a :class:`ComputeTimer` is expected: the end of a rank's compute also starts its wait."""

    def __init__(self, timer: ComputeTimer, busy: BusyTimer) -> None:
        self.timer, self.busy = timer, busy

    def mark_compute_end(self) -> None:
        self.timer.mark_compute_end()
        self.busy.mark_ready()


def _in_lock_step(strategy: object) -> bool:
    # Ranks of an asynchronous strategy (AsyncPSStrategy in ASP) are not in lock-step inside an epoch: exchanging
    # measurements there would make fast ranks wait, so the split changes only at epoch ends.
    return not isinstance(strategy, HeteroBatchStrategy) or strategy.in_lock_step


class _HeteroDataSource:
    """Stands in for Lightning's train-dataloader source and passes what it returns through ``rebuild``."""

    def __init__(self, source: Any, rebuild: Callable[[Any], Any]) -> None:
        self.source = source
        self.rebuild = rebuild

    def dataloader(self) -> Any:
        return self.rebuild(self.source.dataloader())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)


def _wrap_train_data_source(trainer: L.Trainer, rebuild: Callable[[Any], Any]) -> None:
    # Lightning has no public hook between "the user's train loader exists" and "Lightning injects a
    # DistributedSampler into it"; its fit loop reads the loader from `_data_source`, so that is where we step in.
    fit_loop = trainer.fit_loop
    if not hasattr(fit_loop, "_data_source"):
        raise RuntimeError(
            "HeteroBatchCallback could not find the train data source on this Lightning version's fit loop; "
            "please report your Lightning version"
        )
    source = fit_loop._data_source
    if isinstance(source, _HeteroDataSource):
        source = source.source
    fit_loop._data_source = _HeteroDataSource(source, rebuild)
