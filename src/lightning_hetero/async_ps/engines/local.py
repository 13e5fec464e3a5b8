"""Local SGD (``mode="local"``): every rank trains its own copy on claimed chunks for a round, then the ranks
all-reduce their pseudo-gradients once (one SUM all-reduce on the remaining ranks' group, which also makes fp16's
GradScalers one) and an outer optimizer applies them (DiLoCo). The algorithm itself is the pure :mod:`lightning_hetero.local_sgd.rounds`; see
``docs/local_sgd.md``.

Example::

    >>> LocalSGDEngine.lock_step, LocalSGDEngine.through_server, LocalSGDEngine.state_key
    (False, False, 'local_sgd')
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_info

from lightning_hetero._lightning_internals import is_last_batch, optimizers_to_device
from lightning_hetero.allocation import rate_share
from lightning_hetero.asp.protocol import SERVER_RANK
from lightning_hetero.async_ps.interfaces import SavedState
from lightning_hetero.async_ps.runtime.clipping import ClippingStep
from lightning_hetero.async_ps.runtime.grad_scaling import fold_scaler, unfold_scaler
from lightning_hetero.async_ps.runtime.reporting import report_hyperparameters
from lightning_hetero.local_sgd.rounds import LocalRounds, RoundOutcome
from lightning_hetero.measurement import BusyTimer

if TYPE_CHECKING:
    from lightning_hetero.async_ps.runtime.collectives import CollectiveGate
    from lightning_hetero.async_ps.runtime.context import BatchWeighting, PSContext
    from lightning_hetero.async_ps.runtime.fault_tolerance import FaultTolerance
    from lightning_hetero.async_ps.settings import PSSettings


class LocalSGDEngine:
    """Local SGD with an outer optimizer (see the module's docstring); an :class:`~lightning_hetero.async_ps.engines.Engine`.

    Args:
        settings: the strategy's settings (the round budget, ``local_steps``, the outer optimizer,
            ``pseudo_gradient_weighting``).
        weighting: refused when ``HeteroBatchCallback`` attached a batch share.
    """

    title = "local SGD"
    lock_step = False
    through_server = False
    state_key = "local_sgd"

    def __init__(self, settings: PSSettings, weighting: BatchWeighting) -> None:
        self._weighting = weighting
        self._round_budget = settings.round_budget
        self.local_steps = settings.advanced.local_steps
        self.pseudo_gradient_weighting = settings.advanced.pseudo_gradient_weighting
        self.outer = settings.outer
        #: the round state (``None`` before the first local batch); its ``plans``, ``rounds`` and ``bytes_sent``
        #: tell what happened
        self.rounds: LocalRounds | None = None
        self._round_open = False
        self._announced = False
        self._busy_timer = BusyTimer(cpu_clock=None)  # no CPU-time floor in local SGD: one clock read less a step
        self._restored: dict[str, Any] | None = None
        self._step_s: float | None = None
        self._report_due = False  # rank 0 reports the inner optimizer's hyper-parameters at a round's first step
        self._batch_samples = 0
        self._world_size = 1
        self._ctx: PSContext | None = None
        self._fault: FaultTolerance | None = None
        self._gate: CollectiveGate | None = None
        self._clipping: ClippingStep | None = None
        self._schedule_count = 0  # the job's steps the taken-over LR schedulers were stepped for
        self._schedule_limit = (-1, -1)  # (epoch, the job's steps at its end): the schedulers never pass them

    def setup(self, ctx: PSContext, fault: FaultTolerance, gate: CollectiveGate) -> None:
        self._ctx, self._fault, self._gate = ctx, fault, gate
        self._world_size = ctx.world_size
        self._clipping = ClippingStep(ctx, self._weighting.share)

    def _parts(self) -> tuple[PSContext, FaultTolerance, CollectiveGate]:
        assert self._ctx is not None and self._fault is not None and self._gate is not None
        return self._ctx, self._fault, self._gate

    def _build_rounds(self, batch_size: int | None) -> LocalRounds:
        """The round state, once the world size (and, for the default round, the batch size) is known."""
        ctx, _, _ = self._parts()
        budget = self._round_budget.in_samples(ctx.world_size, batch_size or 1)
        rounds = LocalRounds(
            budget, ctx.rank, ctx.world_size, self.outer, self.local_steps, weighting=self.pseudo_gradient_weighting
        )
        rounds.max_steps = ctx.trainer.max_steps
        if self._restored is not None:
            rounds.load_state_dict(self._restored)
            self._restored = None
        return rounds

    # ------------------------------------------------------------------ entering and leaving

    def enter(self, switch: bool) -> None:
        """At the start of training or an epoch's end, from BSP or ASP: every rank starts the next round from the
        same parameters (from ASP, the server's, with its optimizer state, as when entering BSP)."""
        if self._weighting.batch_share is not None:
            raise ValueError(
                "AsyncPSStrategy(mode='local') does not support HeteroBatchCallback: in local SGD every rank already "
                "trains at its own speed (local_steps='proportional'); remove the callback or use BSP/ASP."
            )
        self._round_open = False
        ctx = self._ctx
        if ctx is not None:  # set up, as in every fit: step-interval schedulers follow the job's steps, not the rank's
            ctx.schedules.take_over(ctx.trainer.lr_scheduler_configs)
            self._schedule_count = ctx.counter.version
        self._announce()

    def _announce(self) -> None:
        """Say once per local phase, on rank 0, how local SGD runs (a switch by ``SyncSwitchCallback`` before the
        strategy's own ``on_train_start`` enters the mode twice)."""
        if self._announced:
            return
        self._announced = True
        rank_zero_info(
            f"AsyncPSStrategy: local SGD, rounds of {self.round_description()}, local_steps={self.local_steps!r}, "
            f"pseudo_gradient_weighting={self.pseudo_gradient_weighting!r}, outer optimizer {self.outer.description}"
        )

    def round_description(self) -> str:
        return self._round_budget.describe(self._world_size)

    def leave(self) -> None:
        """At an epoch's end (the ranks' parameters agree after the epoch's last round): the inner optimizers' states
        differ per rank, so rank 0's is given to all (BSP steps identical copies; ASP's server takes rank 0's)."""
        ctx, _, gate = self._parts()
        self._round_open = False
        self._announced = False
        ctx.schedules.release()
        self._set_claim_chunks(1, rates=None)
        optimizer = ctx.optimizer
        state = gate.broadcast(copy.deepcopy(optimizer.state_dict()) if ctx.rank == SERVER_RANK else None, SERVER_RANK)
        optimizer.load_state_dict(state)
        optimizers_to_device([optimizer], ctx.root_device)

    # ------------------------------------------------------------------ steps

    def batch_start(self) -> None:
        """Before a local batch: open the round and start timing the step."""
        self._open_round()
        self._step_s = self._busy_timer.step_start()
        self._batch_samples = self._next_batch_samples()

    def _open_round(self) -> None:
        """Open a round unless one is (the ranks' parameters agree here)."""
        ctx, _, _ = self._parts()
        if self.rounds is None:
            self.rounds = self._build_rounds(self._loader_batch_size())
        if not self._round_open:
            self.rounds.steps_total = ctx.counter.version  # global_step goes on from the previous mode's count
            sampler, epoch = ctx.claim_sampler, ctx.trainer.current_epoch
            if sampler is not None and self._schedule_limit[0] != epoch:  # the epoch's first round
                self._schedule_limit = (epoch, ctx.counter.version + -(-sampler.epoch_samples // sampler.chunk_size))
            self.rounds.begin(ctx.flat.flat, self._loader_batch_size() or 1)
            self._round_open = True
            self._busy_timer.skip()
            self._set_claim_chunks(self.rounds.claim_chunks, self.rounds.rates)
            self._report_due = True

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any, **kwargs: Any) -> Any:
        """A local step with the rank's own optimizer (``gradient_clip_val`` limits the global batch's gradient norm,
        :mod:`~lightning_hetero.async_ps.runtime.clipping`); at the end of its share of the round, or of the epoch, the
        round-end all-reduce."""
        ctx, _, _ = self._parts()
        if self.rounds is not None:
            self._open_round()  # before the step: whether this rank steps at all in the round (max_steps)
        resting = self.rounds is not None and self.rounds.target_steps == 0  # local_sgd/local_stop.py
        if resting:  # Lightning's loop runs the batch's forward and backward; no step is taken
            output = closure()
        elif self._clipping is not None and self._clipping.active:  # clipped at the global batch's norm
            stand_in = self._clipping.optimizer(optimizer)
            closure = self._clipping.closure(closure)
            output = ctx.precision_plugin.optimizer_step(stand_in, model=model, closure=closure, **kwargs)
        else:
            output = ctx.precision_plugin.optimizer_step(optimizer, model=model, closure=closure, **kwargs)
        rounds = self.rounds
        assert rounds is not None  # the closure ran training_step, hence batch_start
        sampler = ctx.claim_sampler  # a validation point inside the epoch ends the epoch's rounds there too
        last = is_last_batch(ctx.trainer) or (sampler is not None and sampler.segment_ended())
        spent = 0 <= rounds.max_steps <= rounds.steps_total  # then only the epoch's (point's) end meets the others
        share_done = not spent if resting else rounds.record_step(self._batch_samples, self._step_s)
        if share_done or last:
            with self._busy_timer.waiting():
                outcome = self._end_round(done=last)
                while last and not outcome.all_done:
                    outcome = self._end_round(done=True)
            self._set_claim_chunks(rounds.claim_chunks, rounds.rates)
            self._report_due = True
            if last:  # every rank is done with the epoch (segment): the next batch begins a round
                self._busy_timer.skip()
                self._round_open = False
        ctx.counter.set(rounds.steps_total, in_step=True)
        progress = rounds.progress() if self._schedule_limit[1] < 0 else min(rounds.progress(), self._schedule_limit[1])
        for count in range(self._schedule_count + 1, progress + 1):
            ctx.schedules.step_at(count)
            self._schedule_count = count
        return output

    def _end_round(self, done: bool) -> RoundOutcome:
        ctx, fault, _ = self._parts()
        rounds = self.rounds
        assert rounds is not None
        flat = ctx.flat.flat
        buffers = ctx.float_buffers()
        flat_buffers = torch.cat([b.detach().reshape(-1) for b in buffers]) if buffers else None
        sampler = ctx.claim_sampler
        message = rounds.message(flat, flat_buffers, done, sampler.samples_left if sampler is not None else None)
        # fp16: the ranks' GradScalers made one in the same all-reduce (async_ps/runtime/grad_scaling.py)
        message, folded = fold_scaler(ctx.precision_plugin, message, ctx.rank, ctx.world_size)
        rounds.bytes_sent += folded * message.element_size()
        group = fault.collective_group()
        fault.collective(lambda: dist.all_reduce(message, op=dist.ReduceOp.SUM, group=group))
        outcome = rounds.apply(unfold_scaler(ctx.precision_plugin, message, folded), flat, flat_buffers)
        if flat_buffers is not None:
            offset = 0
            for buffer in buffers:
                buffer.copy_(flat_buffers[offset : offset + buffer.numel()].view_as(buffer))
                offset += buffer.numel()
        return outcome

    def _set_claim_chunks(self, chunks: int, rates: list[float | None] | None) -> None:
        """Claim this many batches at once from the epoch's pool (local SGD: a share of the round; other modes: 1),
        near the epoch's end at most half of this rank's share of the ranks' speed (``rates``; ``None`` or unknown:
        equal shares) of what is left (:func:`~lightning_hetero.async_ps.runtime.sampler.tail_claim`), and a rank slower than the
        fastest stops claiming once another batch would keep the others waiting
        (:func:`~lightning_hetero.async_ps.runtime.sampler.stops_claiming`)."""
        ctx, _, _ = self._parts()
        sampler = ctx.claim_sampler
        if sampler is not None:
            sampler.claim_chunks = chunks
            sampler.claim_share = None if rates is None else rate_share(rates, ctx.rank)
            shares = [] if rates is None else [rate_share(rates, rank) for rank in range(len(rates))]
            sampler.lead_share = max(shares) if shares and None not in shares else None  # type: ignore[type-var]

    def _loader_batch_size(self) -> int | None:
        ctx, _, _ = self._parts()
        return ctx.claim_sampler.chunk_size if ctx.claim_sampler is not None else None

    def _next_batch_samples(self) -> int:
        """Samples in the batch about to be trained: its chunk's size from the claim sampler (the epoch's last chunk
        may be short), else 1."""
        ctx, _, _ = self._parts()
        sampler = ctx.claim_sampler
        if sampler is None:
            return 1
        chunk = sampler.next_chunk()
        if chunk < 0:
            return sampler.chunk_size
        return max(0, min(sampler.chunk_size, sampler.epoch_samples - chunk * sampler.chunk_size))

    def report_step(self) -> None:
        """Rank 0 reports its optimizer's own momentum and learning rate at a round's first step (the epoch's mean
        is over rounds: the two torchmetrics updates of a report, about 40 µs, stay off the round's other steps)."""
        ctx, _, _ = self._parts()
        if ctx.rank == SERVER_RANK and self._report_due:
            self._report_due = False
            group = ctx.optimizer.param_groups[0]
            report_hyperparameters(ctx.log, ctx.module, group, None, ctx.trainer.current_epoch)

    def epoch_end(self) -> None:
        """Nothing to do: the epoch's last round ended on the ranks' combined parameters."""

    # ------------------------------------------------------------------ checkpoints

    def saved_state(self) -> SavedState | None:
        """Inside a round: the start-of-round parameters (the ranks' combined ones), not this rank's unfinished
        round; equal to the model's at an epoch's end."""
        anchor = self.rounds.outer.anchor if self.rounds is not None else None
        if anchor is None or not self._round_open:
            return None
        return SavedState(anchor)

    def state_dict(self) -> dict[str, Any] | None:
        """The rounds' state (a restored one not in use yet as it was restored)."""
        return self.rounds.state_dict() if self.rounds is not None else self._restored

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is None:
            return
        if self.rounds is not None:
            self.rounds.load_state_dict(state)
        else:
            self._restored = state
        self._round_open = False
