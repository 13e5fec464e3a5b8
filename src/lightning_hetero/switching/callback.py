"""``SyncSwitchCallback``: Lightning glue that asks a switching policy for each epoch's mode and applies it.

The decisions live in :mod:`~lightning_hetero.switching.policies`, :mod:`~lightning_hetero.switching.straggler`
and :mod:`~lightning_hetero.switching.hyperparams`; this module feeds them from Trainer hooks, flips the strategy's
mode at epoch boundaries, logs what happened and keeps the state a resumed run needs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.data import extract_batch_size
from typing_extensions import override

from lightning_hetero._deprecation import renamed_argument
from lightning_hetero._validation import check_finite
from lightning_hetero.contracts import MODES, CompensatedStrategy, Mode, SwitchableStrategy
from lightning_hetero.hetero_batch import HeteroBatchCallback
from lightning_hetero.lr_schedules import CountedLRSchedulers
from lightning_hetero.measurement import ComputeTimer, ThroughputMeter, close_compute_window
from lightning_hetero.switching.hyperparams import LRScheduleClock, PhaseHyperparamController, PhaseHyperparams
from lightning_hetero.switching.policies import EpochContext, FixedFractionPolicy, SchedulePolicy, SwitchPolicy
from lightning_hetero.switching.straggler import StragglerDetector


def summarize_phases(epochs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Group per-epoch records ``{"epoch", "mode", "time_s", "samples"}`` into phases of consecutive epochs in the
    same mode, with their total time and throughput (samples per second, summed over ranks).

    Example::

        >>> records = [{"epoch": 0, "mode": "bsp", "time_s": 2.0, "samples": 100},
        ...            {"epoch": 1, "mode": "asp", "time_s": 1.0, "samples": 100},
        ...            {"epoch": 2, "mode": "asp", "time_s": 1.0, "samples": 100}]
        >>> [(p["mode"], p["epochs"], p["time_s"], p["throughput"]) for p in summarize_phases(records)]
        [('bsp', '0', 2.0, 50.0), ('asp', '1-2', 2.0, 100.0)]
    """
    phases: list[dict[str, Any]] = []
    for record in epochs:
        last = phases[-1] if phases else None
        if last is not None and last["mode"] == record["mode"] and last["last_epoch"] + 1 == record["epoch"]:
            last["last_epoch"] = record["epoch"]
            last["time_s"] += record["time_s"]
            last["samples"] += record["samples"]
        else:
            kept = {key: record[key] for key in ("mode", "time_s", "samples")}
            phases.append({**kept, "first_epoch": record["epoch"], "last_epoch": record["epoch"]})
    for phase in phases:
        first, last = phase["first_epoch"], phase["last_epoch"]
        phase["epochs"] = str(first) if first == last else f"{first}-{last}"
        phase["throughput"] = phase["samples"] / phase["time_s"] if phase["time_s"] > 0 else 0.0
    return phases


class SyncSwitchCallback(Callback):
    """Switch a strategy between synchronous (BSP) and asynchronous (ASP) training at epoch boundaries.

    Before every epoch the policy chooses the mode, given the epoch, ``max_epochs``, the modes trained so far and
    whether a straggler is detected on any rank; when it differs from the current mode, the callback calls the
    strategy's ``set_mode`` in ``on_train_epoch_end`` (the same value on every rank), and the strategy switches in
    process before the next epoch. Per-phase learning-rate and momentum overrides are applied at the same moment.

    Example::

        >>> from lightning_hetero.switching import SchedulePolicy, PhaseHyperparams
        >>> callback = SyncSwitchCallback(policy="bsp:0-1,asp:2-", hyperparams={"asp": PhaseHyperparams(lr_scale=0.5)})
        >>> callback.policy
        SchedulePolicy('bsp:0-1,asp:2-')
        >>> SyncSwitchCallback(policy="bsp:0-4,asp:4-")
        Traceback (most recent call last):
        ...
        ValueError: schedule 'bsp:0-4,asp:4-': phases bsp:0-4 and asp:4- overlap at epoch 4

    Args:
        policy: a :class:`~lightning_hetero.switching.SwitchPolicy`, or a schedule string such as
            ``"bsp:0-4,asp:5-"`` (a :class:`~lightning_hetero.switching.SchedulePolicy`). Default: 5% of the
            epochs in BSP, then ASP.
        hyperparams: per-mode :class:`~lightning_hetero.switching.PhaseHyperparams` (learning-rate scale, momentum,
            momentum ramp), or mappings of their arguments. Not needed with ``AsyncPSStrategy``, whose asynchrony
            compensation (on by default) adapts the ASP phase's momentum and learning rate at every switch; giving
            ``"asp"`` here turns that compensation off and uses these values instead.
        detector: the per-rank straggler detector used by policies with ``uses_stragglers`` (such as
            :class:`~lightning_hetero.switching.GreedyPolicy`); default ``StragglerDetector()``.
        lr_schedule_steps_per_epoch: the steps per epoch that step-interval LR schedules were written for (the steps
            of a BSP epoch); default: the BSP loader's length, or measured in the first epoch. See
            :class:`~lightning_hetero.switching.hyperparams.LRScheduleClock`.
        smoothing: EWMA weight of the newest throughput measurement fed to the detector.
        warmup_steps: throughput measurements discarded at the start and after each switch.
        throughput_meter: a :class:`~lightning_hetero.measurement.ThroughputMeter` that another callback feeds, read
            after every batch instead of this callback's own. Default: a ``HeteroBatchCallback``'s ``meter`` when
            one is in the Trainer (its compute window ends before the gradient all-reduce), else this callback
            measures batch start to the end of backward itself.
        verbose: print the end-of-fit phase summary on rank 0.
        schedule_steps_per_epoch: deprecated old name of ``lr_schedule_steps_per_epoch``; removed in the next
            release.

    Notes:
        - The strategy must offer :class:`~lightning_hetero.contracts.SwitchableStrategy` (``mode``,
          ``set_mode(mode)``, ``last_switch_s``; :class:`~lightning_hetero.AsyncPSStrategy` does); setup fails
          otherwise.
        - Throughput comes from ``throughput_meter`` when given, else from a ``HeteroBatchCallback``'s meter in the
          Trainer, else from this callback's own compute window (batch start to the end of backward).
        - Each epoch's mode is logged one-hot as ``sync_switch/bsp``, ``sync_switch/asp`` and ``sync_switch/local``
          (1 for the epoch's mode, 0 for the others), with ``sync_switch/epoch_time_s``
          (training only, validation excluded) and ``sync_switch/throughput`` (samples/s over all ranks).
        - Step-interval LR schedulers (not ``ReduceLROnPlateau``) are stepped by this callback instead of Lightning,
          by a fixed number of steps per epoch whatever the mode, so ASP epochs (where ranks make different numbers
          of steps) neither stretch nor squeeze the schedule and all ranks agree on it at every epoch boundary.
        - Momentum ramps advance once per training step of the rank.
        - The modes trained so far and the one planned next are checkpointed; a resumed run continues the schedule.
          Policies must be deterministic in their :class:`~lightning_hetero.switching.EpochContext`.
    """

    def __init__(
        self,
        policy: SwitchPolicy | str | None = None,
        hyperparams: Mapping[str, PhaseHyperparams | Mapping[str, Any]] | None = None,
        detector: StragglerDetector | None = None,
        lr_schedule_steps_per_epoch: int | None = None,
        smoothing: float = 0.3,
        warmup_steps: int = 3,
        verbose: bool = True,
        throughput_meter: ThroughputMeter | None = None,
        schedule_steps_per_epoch: int | None = None,
    ) -> None:
        lr_schedule_steps_per_epoch = renamed_argument(
            "SyncSwitchCallback",
            "schedule_steps_per_epoch",
            "lr_schedule_steps_per_epoch",
            schedule_steps_per_epoch,
            lr_schedule_steps_per_epoch,
        )
        check_finite(smoothing=smoothing)
        if policy is None:
            policy = FixedFractionPolicy()
        elif isinstance(policy, str):
            policy = SchedulePolicy(policy)
        elif not isinstance(policy, SwitchPolicy):
            raise TypeError(f"policy must be a SwitchPolicy or a schedule string, got {type(policy).__name__}")
        self.policy: SwitchPolicy = policy
        self.hyperparams = PhaseHyperparamController(hyperparams)
        self.detector = detector if detector is not None else StragglerDetector()
        self.lr_schedule_clock = LRScheduleClock(lr_schedule_steps_per_epoch)
        self.meter = ThroughputMeter(smoothing=smoothing, warmup_steps=warmup_steps)
        self.timer = ComputeTimer()
        self.verbose = verbose
        self.history: list[str] = []
        self.planned: dict[int, str] = {}
        self.epochs: list[dict[str, Any]] = []
        self.switches: list[dict[str, Any]] = []
        self.straggler = False
        self._max_epochs: int | None = None
        self._shared_meter = throughput_meter
        self._meter_given = throughput_meter is not None
        self._shared_count = 0
        self._epoch_start_s = 0.0
        self._validation_start_s = 0.0
        self._validation_s = 0.0
        self._epoch_samples = 0
        self._epoch_steps = 0
        self._local_steps: dict[str, int] = {}
        self._lr_schedulers = CountedLRSchedulers()

    # ------------------------------------------------------------------ setup

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        strategy = trainer.strategy
        if not isinstance(strategy, SwitchableStrategy):
            raise TypeError(
                f"SyncSwitchCallback needs a strategy with `mode` and `set_mode(mode)` (and `last_switch_s`), such as "
                f"AsyncPSStrategy (strategy='async_ps'); got {type(strategy).__name__}"
            )
        if not pl_module.automatic_optimization:
            raise ValueError(
                "SyncSwitchCallback cannot switch a model with manual optimization (`self.automatic_optimization = "
                "False`) to ASP or local SGD, where the server or the round's outer step applies the optimizer; train "
                "it with AsyncPSStrategy(mode='bsp') alone or with strategy='ddp' and HeteroBatchCallback, or use automatic "
                "optimization."
            )
        if not self._meter_given:  # a HeteroBatchCallback measures the compute window already: read its meter
            hetero = next((c for c in trainer.callbacks if isinstance(c, HeteroBatchCallback)), None)
            self._shared_meter = hetero.meter if hetero is not None else None
        max_epochs = trainer.max_epochs
        self._max_epochs = None if max_epochs is None or max_epochs < 0 else max_epochs
        self.policy.check_max_epochs(self._max_epochs)
        if (
            "asp" in self.hyperparams.phases
            and isinstance(strategy, CompensatedStrategy)
            and strategy.asynchrony_compensation is not None
        ):
            # the user chose the ASP phase's hyper-parameters: the server uses them as they are
            strategy.asynchrony_compensation = None
            rank_zero_info(
                "SyncSwitchCallback: hyperparams['asp'] is given, so the strategy's asynchrony compensation is off "
                "and ASP uses those hyper-parameters as they are."
            )

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After any checkpoint restore: optimizers and schedulers hold their saved (already phase-scaled) values.
        self.hyperparams.bind(trainer.optimizers, [config.scheduler for config in trainer.lr_scheduler_configs])
        self._take_over_lr_schedulers(trainer)
        epoch = trainer.current_epoch
        # A checkpoint saved before this callback's epoch end (at validation end) lacks the last epoch's mode.
        while len(self.history) < epoch and len(self.history) in self.planned:
            self.history.append(self.planned[len(self.history)])
        mode = self.planned.get(epoch) or self._decide(epoch)
        self.planned[epoch] = mode
        self._apply_mode(trainer, mode, epoch)

    def _take_over_lr_schedulers(self, trainer: L.Trainer) -> None:
        self._lr_schedulers.release()
        self._lr_schedulers.take_over(trainer.lr_scheduler_configs)

    def _advance_lr_schedulers(self, reference_steps: int) -> None:
        last = self.lr_schedule_clock.taken
        for count in range(last - reference_steps + 1, last + 1):
            self._lr_schedulers.step_at(count)

    def _decide(self, epoch: int) -> Mode:
        context = EpochContext(epoch, self._max_epochs, tuple(self.history), self.straggler)
        return self.policy.mode_for_epoch(context)

    def _apply_mode(self, trainer: L.Trainer, mode: Mode, epoch: int) -> None:
        """Enter ``mode``'s hyper-parameters, then switch the strategy (entering ASP copies rank 0's optimizer,
        new hyper-parameters included, into the server)."""
        if self.hyperparams.mode != mode:
            self.hyperparams.enter(mode, switched=self.hyperparams.mode is not None)
        strategy = trainer.strategy
        previous = strategy.mode
        if previous == mode:
            return
        started = time.perf_counter()
        strategy.set_mode(mode)
        elapsed_s = time.perf_counter() - started
        cost_s = strategy.last_switch_s
        self.switches.append(
            {"epoch": epoch, "from": previous, "to": mode, "cost_s": elapsed_s if cost_s is None else cost_s}
        )
        self.meter.restart_warmup()

    # ------------------------------------------------------------------ per step

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        epoch = trainer.current_epoch
        mode = trainer.strategy.mode
        if self.planned.get(epoch, mode) != mode:
            raise RuntimeError(
                f"epoch {epoch} was planned in {self.planned[epoch]!r} but the strategy trains in {mode!r}; "
                f"{type(trainer.strategy).__name__}.set_mode did not take effect"
            )
        self._epoch_start_s = time.perf_counter()
        self._validation_s = 0.0
        self._epoch_samples = 0
        self._epoch_steps = 0
        batches = trainer.num_training_batches
        known = int(batches) if isinstance(batches, (int, float)) and math.isfinite(batches) and batches > 0 else None
        if self.lr_schedule_clock.steps_per_epoch is None:
            # a schedule sized by `estimated_stepping_batches` advances by the strategy's estimate per epoch
            estimate = getattr(trainer.strategy, "estimated_steps_per_epoch", None)
            self.lr_schedule_clock.steps_per_epoch = estimate or (known if mode == "bsp" else None)
        self.lr_schedule_clock.begin_epoch(epoch, self._local_steps.get(mode, known))

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validation_start_s = time.perf_counter()

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validation_s += time.perf_counter() - self._validation_start_s

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.hyperparams.before_optimizer_step()
        self.timer.start()

    @override
    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.timer.mark_compute_end()

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        samples = extract_batch_size(batch)
        self._epoch_samples += samples
        self._epoch_steps += 1
        self._advance_lr_schedulers(self.lr_schedule_clock.step())
        if not self.policy.uses_stragglers:
            return
        if self._shared_meter is not None:
            # another callback feeds this meter (e.g. HeteroBatchCallback's): read it only when it has a new value
            if self._shared_meter.count != self._shared_count and self._shared_meter.value is not None:
                self._shared_count = self._shared_meter.count
                self.detector.update(self._shared_meter.value)
            return
        value = close_compute_window(self.timer, self.meter, samples)
        if value is not None:
            self.detector.update(value)

    # ------------------------------------------------------------------ epoch boundary

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        epoch = trainer.current_epoch
        strategy = trainer.strategy
        mode = strategy.mode
        elapsed_s = time.perf_counter() - self._epoch_start_s - self._validation_s
        local = [float(self._epoch_samples), float(self.detector.straggling), float(self._epoch_steps)]
        gathered = strategy.all_gather(torch.tensor(local, dtype=torch.float64)).reshape(-1, 3)
        samples = int(gathered[:, 0].sum().item())
        self.straggler = bool(gathered[:, 1].max().item() > 0)
        self._local_steps[mode] = self._epoch_steps
        self._advance_lr_schedulers(self.lr_schedule_clock.end_epoch(round(gathered[:, 2].mean().item())))
        self.epochs.append({"epoch": epoch, "mode": mode, "time_s": elapsed_s, "samples": samples})
        self.history.append(mode)
        metrics = {
            **{f"sync_switch/{name}": float(name == mode) for name in MODES},
            "sync_switch/epoch_time_s": elapsed_s,
            "sync_switch/throughput": samples / elapsed_s if elapsed_s > 0 else 0.0,
            "sync_switch/straggler": float(self.straggler),
        }
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        next_epoch = epoch + 1
        if self._max_epochs is not None and next_epoch >= self._max_epochs:
            return
        next_mode = self._decide(next_epoch)
        self.planned[next_epoch] = next_mode
        if next_mode != mode:
            self._apply_mode(trainer, next_mode, next_epoch)

    # ------------------------------------------------------------------ summary and state

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._lr_schedulers.release()
        if self.verbose:
            rank_zero_info(self.summary())

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._lr_schedulers.release()

    def summary(self) -> str:
        """The phases trained (mode, epochs, time, throughput) and the switches with their cost."""
        lines = [
            f"SyncSwitchCallback summary ({self.policy!r})",
            f"{'mode':>4} {'epochs':>8} {'time (s)':>9} {'throughput (samples/s)':>23}",
        ]
        for phase in summarize_phases(self.epochs):
            lines.append(
                f"{phase['mode']:>4} {phase['epochs']:>8} {phase['time_s']:>9.2f} {phase['throughput']:>23.1f}"
            )
        for switch in self.switches:
            lines.append(
                f"switch {switch['from']} -> {switch['to']} before epoch {switch['epoch']}: {switch['cost_s']:.3f} s"
            )
        return "\n".join(lines)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "history": list(self.history),
            "planned": {str(epoch): mode for epoch, mode in self.planned.items()},
            "epochs": list(self.epochs),
            "switches": list(self.switches),
            "straggler": self.straggler,
            "detector": self.detector.state_dict(),
            "meter": self.meter.state_dict(),
            "hyperparams": self.hyperparams.state_dict(),
            "schedule_clock": self.lr_schedule_clock.state_dict(),  # the key checkpoints have always had
            "local_steps": dict(self._local_steps),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict["history"])
        self.planned = {int(epoch): mode for epoch, mode in state_dict["planned"].items()}
        self.epochs = list(state_dict["epochs"])
        self.switches = list(state_dict["switches"])
        self.straggler = state_dict["straggler"]
        self.detector.load_state_dict(state_dict["detector"])
        self.meter.load_state_dict(state_dict["meter"])
        self.hyperparams.load_state_dict(state_dict["hyperparams"])
        self.lr_schedule_clock.load_state_dict(state_dict["schedule_clock"])
        self._local_steps = dict(state_dict["local_steps"])
