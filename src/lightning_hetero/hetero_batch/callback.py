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
from lightning.pytorch.utilities import rank_zero_info
from torch.nn.parallel import DistributedDataParallel

from lightning_hetero._validation import check_finite
from lightning_hetero.hetero_batch.aggregation import BatchWeightState, register_batch_weighted_hook
from lightning_hetero.hetero_batch.controller import BatchSizeController, step_time_s
from lightning_hetero.hetero_batch.loader import build_hetero_loader, starting_batch_size
from lightning_hetero.hetero_batch.lr_scaling import LR_SCALING_RULES, lr_scale_factor, scale_learning_rates
from lightning_hetero.hetero_batch.sampler import HeteroBatchSampler, SplitPlan
from lightning_hetero.measurement import ComputeTimer, StepCostModel, ThroughputMeter


class HeteroBatchCallback(Callback):
    """Resize each rank's share of every global batch in proportion to its measured compute throughput.

    Each rank times its own forward and backward (excluding data loading and waiting for other ranks) and fits its
    step time as a fixed overhead plus a per-sample cost; at each adjustment all ranks exchange their fits and
    apply the same new split, the one that makes their predicted step times equal.
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
        smoothing: EWMA weight of the newest measurement (per-sample cost and observed throughput).
        warmup_steps: measurements discarded at the start of fit (and one after each change of split).
        adjust_every_n_steps: also adjust every ``n`` optimizer steps inside an epoch; by default the split changes
            only at epoch ends.
        lr_scaling: ``"linear"`` or ``"sqrt"`` to rescale learning rates when ``global_batch_size`` differs from
            the loader's ``batch_size`` x world size; ``None`` leaves them alone.
        seed: seeds the per-epoch permutation, identically on every rank.
        verbose: print the end-of-fit summary on rank 0.

    Notes:
        - Works with ``strategy="ddp"`` (any DDP launcher; CPU/gloo and CUDA/NCCL), with single-device training,
          and with strategies that offer ``attach_hetero_batches(compute_timer, batch_share)`` such as
          :class:`~lightning_hetero.AsyncPSStrategy`.
        - The model's loss must be a mean over the local batch (the usual reduction), so that weighting by
          ``b_k / Σ b`` yields the big-batch mean. Batch norm sees per-rank batches of different sizes.
        - Collectives inside ``training_step`` (for example ``self.log(..., sync_dist=True)``) make a fast rank wait
          inside its compute window and blur the measurement; log with ``sync_dist=False`` during training.
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
        self.meter = ThroughputMeter(smoothing=smoothing, warmup_steps=warmup_steps)
        self.cost = StepCostModel(smoothing=smoothing, warmup_steps=warmup_steps)
        #: every rank's (overhead_s, per_sample_s) at the last exchange
        self.costs: tuple[tuple[float, float], ...] | None = None
        self.timer = ComputeTimer()
        self.controller: BatchSizeController | None = None
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
        if self._world_size > 1 and not (_is_ddp(strategy) or hasattr(strategy, "attach_hetero_batches")):
            raise ValueError(
                f"HeteroBatchCallback supports strategy='ddp' (and strategies with attach_hetero_batches), "
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
        if hasattr(strategy, "attach_hetero_batches"):
            strategy.attach_hetero_batches(self.timer, lambda: self._share)
            self._gradients_hooked = True
        elif isinstance(strategy.model, DistributedDataParallel):
            state = BatchWeightState(share=lambda: self._share, timer=self.timer)
            register_batch_weighted_hook(strategy.model, state)
            self._gradients_hooked = True

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
                self.meter.value = self.throughputs[self._rank]
            if restored.get("costs"):
                self.costs = tuple(tuple(c) for c in restored["costs"])
                self.cost.overhead_s, self.cost.per_sample_s = self.costs[self._rank]
            return split
        if self.initial_batch_sizes is not None:
            return self.initial_batch_sizes
        return self.controller.equal_split()

    # ------------------------------------------------------------------ per step

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        assert self.sampler is not None
        sizes = self.sampler.next_sizes()
        self._local_batch_size = sizes[self._rank]
        self._share = sizes[self._rank] / sum(sizes)
        self.timer.start()

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._gradients_hooked:
            self.timer.mark_compute_end()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        elapsed = self.timer.elapsed_s()
        if elapsed is not None:
            self.meter.update(self._local_batch_size, elapsed)
            self.cost.update(self._local_batch_size, elapsed)
        n = self.adjust_every_n_steps
        assert self.sampler is not None
        mid_epoch = n is not None and (batch_idx + 1) % n == 0 and batch_idx + 1 < len(self.sampler)
        if mid_epoch and not _asynchronous(trainer.strategy):
            self._adjust(trainer, epoch_end=False)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._adjust(trainer, epoch_end=True)

    def _adjust(self, trainer: L.Trainer, epoch_end: bool) -> None:
        assert self.sampler is not None and self.plan is not None and self.controller is not None
        observed = math.nan if self.meter.value is None else self.meter.value
        per_sample = math.nan if self.cost.per_sample_s is None else self.cost.per_sample_s
        local = torch.tensor(
            [observed, self.cost.overhead_s, per_sample, float(self.sampler.produced_position)], dtype=torch.float64
        )
        gathered = trainer.strategy.all_gather(local).reshape(-1, 4)
        if torch.isnan(gathered[:, :3]).any():
            return
        self.throughputs = tuple(float(x) for x in gathered[:, 0])
        self.costs = tuple((float(a), float(c)) for a, c in gathered[:, 1:3].tolist())
        decision = self.controller.decide(
            self.plan.current, [1.0 / c for _, c in self.costs], overheads_s=[a for a, _ in self.costs]
        )
        if not decision.apply:
            return
        position = int(gathered[:, 3].max().item()) + 1
        if epoch_end:
            position = max(position, self.sampler.position(trainer.current_epoch + 1, 0))
        previous = self.plan.current
        self.plan.schedule(position, decision.sizes)
        self.meter.restart_warmup(1)
        self.cost.restart_warmup(1)
        self.history.append(
            {
                "step": trainer.global_step,
                "epoch": trainer.current_epoch,
                "from": previous,
                "to": decision.sizes,
                "costs": self.costs,
            }
        )
        metrics = {f"hetero/batch_size_rank{k}": float(b) for k, b in enumerate(decision.sizes)}
        metrics |= {f"hetero/throughput_rank{k}": x for k, x in enumerate(self.throughputs)}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    # ------------------------------------------------------------------ summary and state

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.verbose and trainer.is_global_zero and self.plan is not None:
            rank_zero_info(self.summary())

    def summary(self) -> str:
        """A one-screen table: per-rank sizes and throughputs, adjustments, and the estimated speedup."""
        assert self.plan is not None and self.controller is not None
        sizes = self.plan.current
        lines = ["HeteroBatchCallback summary", f"{'rank':>4} {'batch size':>10} {'throughput (samples/s)':>23}"]
        for rank, size in enumerate(sizes):
            throughput = f"{self.throughputs[rank]:23.1f}" if self.throughputs else f"{'n/a':>23}"
            lines.append(f"{rank:>4} {size:>10} {throughput}")
        lines.append(f"global batch {sum(sizes)}, adjustments {len(self.history)}")
        if self.costs:
            rates, overheads = [1.0 / c for _, c in self.costs], [a for a, _ in self.costs]
            equal = step_time_s(self.controller.equal_split(), rates, overheads)
            speedup = equal / step_time_s(sizes, rates, overheads)
            lines.append(f"estimated speedup over equal batches: {speedup:.2f}x")
        return "\n".join(lines)

    def state_dict(self) -> dict[str, Any]:
        return {
            "split": None if self.plan is None else list(self.plan.current),
            "throughputs": None if self.throughputs is None else list(self.throughputs),
            "costs": None if self.costs is None else [list(c) for c in self.costs],
            "lr_scale_applied": self._lr_scale_applied,
            "history": self.history,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored = state_dict if state_dict.get("split") else None
        self._lr_scale_applied = state_dict.get("lr_scale_applied", False)
        self.history = list(state_dict.get("history", []))
        self.plan = None


def _asynchronous(strategy: Any) -> bool:
    # Ranks of an asynchronous strategy (AsyncPSStrategy in ASP) are not in lock-step inside an epoch: exchanging
    # measurements there would make fast ranks wait, so the split changes only at epoch ends.
    return getattr(strategy, "mode", None) == "asp"


def _is_ddp(strategy: Any) -> bool:
    from lightning.pytorch.strategies import DDPStrategy

    return isinstance(strategy, DDPStrategy)


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
