"""``HeteroBatchCallback``: Lightning glue that feeds the tuner (:mod:`~.tuner`) and applies what it decides."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_hetero._lightning_internals import rebuild_train_dataloader
from lightning_hetero.hetero_batch import batches, settings
from lightning_hetero.hetero_batch.gradients import LossWeighting
from lightning_hetero.hetero_batch.memory import MemoryGuard, auto_memory_guard, restore_caps, saved_caps
from lightning_hetero.hetero_batch.period import gather_rows, in_lock_step, read_rows
from lightning_hetero.hetero_batch.settings import HeteroBatchAdvanced, HeteroBatchSettings
from lightning_hetero.hetero_batch.timing import PendingSteps, WaitExclusion, start_measuring
from lightning_hetero.hetero_batch.tuner import SplitTuner, adjustment_metrics
from lightning_hetero.measurement import BusyTimer, ComputeTimer, ThroughputMeter, close_compute_window


class HeteroBatchCallback(Callback):
    """Resize each rank's share of every global batch in proportion to its measured compute throughput.

    Each rank's busy time per step is measured, waits excluded (:mod:`~.timing`); at each adjustment every rank takes
    the same decision (:class:`~.tuner.SplitTuner`): the split equalising predicted step times. The global batch, the
    data per epoch and the gradient (``Σ b_k g_k / Σ b_k``, :mod:`~.gradients`) stay those of one big batch.

    Example::

        >>> import lightning as L
        >>> from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule
        >>> callback = HeteroBatchCallback(verbose=False, advanced=HeteroBatchAdvanced(warmup_steps=2))
        >>> trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, callbacks=[callback], logger=False,
        ...                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        >>> trainer.fit(MLPClassifier(), datamodule=SyntheticClassificationDataModule(num_samples=256, batch_size=32))
        >>> callback.batch_sizes
        (32,)

    Args:
        global_batch_size: the sum of all ranks' batch sizes; default: the loader's ``batch_size`` x world size.
        initial_batch_sizes: a starting split, one size per rank, summing to the global batch; default: equal.
        min_batch_size: smallest per-rank batch (an int, or one per rank).
        max_batch_size: largest per-rank batch (an int, one per rank, or ``None``).
        memory_caps: per-rank largest batch that fits in memory, or ``"auto"``: learnt, and steps out of memory redone.
        batch_size_multiple: per-rank sizes are multiples of this; ``"auto"``: 8 on CUDA where shares allow, else 1.
        adjust_every_n_steps: also adjust every ``n`` steps inside an epoch; default: the cadence of :mod:`~.period`.
        batch_lr_scaling: ``"linear"`` or ``"sqrt"``: rescale learning rates for a global batch not the loader's.
        verbose: print the end-of-fit summary on rank 0.
        advanced: :class:`~.HeteroBatchAdvanced`, the expert knobs (old keywords, ``lr_scaling``: deprecated).

    Notes:
        - Works with ``strategy="ddp"``, one device, ``"fsdp"`` (accepted, not yet run) and strategies offering
          :class:`~lightning_hetero.contracts.HeteroBatchStrategy` (``AsyncPSStrategy``: in ASP at epoch ends only).
        - The loss must be a mean over the local batch. Direct ``torch.distributed`` calls count as busy time.
        - Settings are held read-only in :attr:`settings`; the checkpoint holds the split in force and the fits.
    """

    def __init__(
        self,
        global_batch_size: int | None = None,
        initial_batch_sizes: Sequence[int] | None = None,
        min_batch_size: int | Sequence[int] = 1,
        max_batch_size: int | Sequence[int] | None = None,
        memory_caps: Sequence[int | None] | str | None = None,
        *,
        batch_size_multiple: int | str = "auto",
        adjust_every_n_steps: int | None = None,
        batch_lr_scaling: str | None = None,
        verbose: bool = True,
        advanced: HeteroBatchAdvanced | None = None,
        **deprecated: Any,
    ) -> None:
        batch_lr_scaling, advanced = settings.old_keywords(batch_lr_scaling, advanced, deprecated)
        #: what the callback was constructed with, checked (read-only; its fields in the order of these arguments)
        self.settings = HeteroBatchSettings(
            global_batch_size, initial_batch_sizes, min_batch_size, max_batch_size, memory_caps, batch_size_multiple,  # type: ignore[arg-type]
            adjust_every_n_steps, batch_lr_scaling, verbose, advanced,
        )  # fmt: skip
        knobs = self.settings.advanced
        self.meter = ThroughputMeter(smoothing=knobs.smoothing, warmup_steps=knobs.warmup_steps)
        self.timer, self.busy = ComputeTimer(), BusyTimer()
        self.exclusion = WaitExclusion(self.busy)
        #: the decisions, built with the train loader (the global batch depends on its ``batch_size``)
        self.tuner: SplitTuner | None = None
        self.sampler: batches.HeteroBatchSampler | None = None
        self._pending, self._weighting = PendingSteps(), LossWeighting()
        self._rank, self._world_size, self._device = 0, 1, torch.device("cpu")
        self._floor, self._local_batch_size = 1, 0  # floor: the samples a rank needs per step (2 with BatchNorm)
        self._loader_global_batch: int | None = None  # the loader's batch_size x world size
        self._lr_scale_applied = False
        self._restored: dict[str, Any] | None = None
        self._memory: MemoryGuard | None = None  # memory_caps="auto"
        self._recompiles: batches.RecompileWatch | None = None

    @property
    def batch_sizes(self) -> tuple[int, ...] | None:
        """The newest split, one size per rank (``None`` before the train loader is built)."""
        return None if self.tuner is None else self.tuner.split

    @property
    def history(self) -> list[dict[str, Any]]:
        """One entry per applied change of split: ``step``, ``epoch``, ``from``, ``to``, ``reason`` and more."""
        return [] if self.tuner is None else self.tuner.history

    def __getattr__(self, name: str) -> Any:
        return settings.moved_attribute(self, name)  # the settings and the tuner's parts were attributes here

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._rank, self._world_size = trainer.global_rank, trainer.world_size
        settings.check_trainer(trainer, pl_module, self.settings.memory_caps)
        self.settings.check_world_size(self._world_size)
        self._floor = settings.model_floor(pl_module, self.settings.min_batch_size)
        self._device, self._recompiles = trainer.strategy.root_device, batches.RecompileWatch(self._rank)
        if self.settings.memory_caps == "auto":
            self._memory = auto_memory_guard(self._rank, self._world_size, self._device, lambda: self._local_batch_size)
        rebuild_train_dataloader(trainer, self._rebuild_loader)

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        marks, self._pending.quota = start_measuring(trainer, pl_module.device, self.timer, self.busy, self.exclusion)
        self._weighting.attach(trainer.strategy, marks, trainer.accumulate_grad_batches, self._world_size)
        if self._memory is not None:
            self._memory.install(trainer.strategy, pl_module)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.tuner is not None and self.sampler is not None:  # the cadence chosen for these epochs, once per fit
            cadence = self.tuner.start_fit(trainer.current_epoch, len(self.sampler), in_lock_step(trainer.strategy))
            rank_zero_info(f"HeteroBatchCallback: adjusts the split {cadence}")
        # once per run (the checkpoint remembers it): the train loader, built by now, fixed both global batches
        if not self._lr_scale_applied and self.tuner is not None and self._loader_global_batch is not None:
            global_batch, rule = self.tuner.controller.global_batch_size, self.settings.batch_lr_scaling
            settings.scale_learning_rates_once(trainer, rule, self._loader_global_batch, global_batch)
            self._lr_scale_applied = True

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.exclusion.remove(trainer.strategy)
        MemoryGuard.remove(trainer.strategy)

    def _rebuild_loader(self, dataloader: Any) -> torch.utils.data.DataLoader:
        rank, floor = self._rank, self._floor
        self._loader_global_batch = batches.starting_batch_size(dataloader) * self._world_size
        global_batch = self.settings.global_batch(self._loader_global_batch)
        if self.tuner is None or self.tuner.controller.global_batch_size != global_batch:
            world, device = self._world_size, self._device.type
            self.tuner = SplitTuner.from_settings(self.settings, global_batch, rank, world, device, floor)
            if self._memory is not None:  # chunks within a memory cap in multiples of batch_size_multiple too
                self._memory.caps.multiple = self.tuner.controller.multiple
            self.tuner.load_state_dict(self._restored or {})  # a checkpoint's state, once (none: nothing to load)
            self._restored = None
        seed = self.settings.advanced.seed
        loader = batches.build_hetero_loader(dataloader, self.tuner.plan, rank=rank, seed=seed, min_size=floor)
        self.sampler = loader.sampler  # type: ignore[assignment]
        return loader

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        sampler, tuner = self.sampler, self.tuner
        assert sampler is not None and tuner is not None
        span = self.busy.close_step()  # read once its clock has it (CUDA events: once the device got there)
        sizes = tuple(sampler.next_sizes())
        self._pending.next_step(span, self.busy.last_cpu_s, sizes, tuner)
        self._local_batch_size = sizes[self._rank]
        batches.mark_batch_dynamic(batch, self._local_batch_size)  # torch.compile: one graph for the changing sizes
        self._weighting.step(sizes, self._rank, batch_idx, trainer.accumulate_grad_batches, sampler)
        self.timer.start()

    @override
    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        self._weighting.backward(loss)

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
        tuner, sampler = self.tuner, self.sampler
        assert tuner is not None and sampler is not None
        if tuner.adjusts_after(batch_idx + 1, len(sampler), trainer.current_epoch) and in_lock_step(trainer.strategy):
            self._adjust(trainer, epoch_end=False)

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.busy.skip()  # a validation run inside the epoch is not part of any training step's cost

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.busy.skip()  # the step across the epoch boundary pays for epoch-end work: not measured
        self._adjust(trainer, epoch_end=True)

    def _adjust(self, trainer: L.Trainer, epoch_end: bool) -> None:
        tuner, sampler, memory = self.tuner, self.sampler, self._memory
        assert tuner is not None and sampler is not None
        self._pending.feed(tuner, wait=True)
        if self._recompiles is not None:
            self._recompiles.check()  # warns once, naming the rank, past RECOMPILE_BOUND graphs
        row = tuner.close_period(sampler.produced_position, None if memory is None else memory.caps.own)
        seen = read_rows(gather_rows(trainer.strategy, row, self.busy))
        if memory is not None:  # the guard chunks by its own cap and checkpoints every rank's
            memory.caps.read(seen.memory_caps)
        # at an epoch's end the new split starts with the next epoch (the sampler's position of its first step)
        not_before, measured = sampler.position(trainer.current_epoch + 1, 0) if epoch_end else 0, tuner.split
        decision = tuner.adjust(seen, step=trainer.global_step, epoch=trainer.current_epoch, not_before=not_before)
        if decision is None:
            return
        if decision.apply:
            self.meter.restart_warmup(1)
        metrics = adjustment_metrics(tuner.predicted_step_s(measured), tuner.sync_step_s, tuner.split)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.settings.verbose and trainer.is_global_zero and self.tuner is not None:
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
