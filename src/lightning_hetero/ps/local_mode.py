"""``AsyncPSStrategy``'s local-SGD mode (``mode="local"``) on the Lightning side: local steps, round-end all-reduces,
the epoch's end, mode switches into and out of it, and its checkpoint state.

A mixin of :class:`~lightning_hetero.ps.strategy.AsyncPSStrategy` (it reads the strategy's flat parameters, claim
sampler and collective helpers); the algorithm itself is the pure :mod:`lightning_hetero.ps.local_sgd`. Every
round ends in one SUM all-reduce on the strategy's collective group (the default process group). See
``docs/local_sgd.md``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from lightning_hetero._lightning_internals import is_last_batch, optimizers_to_device
from lightning_hetero.measurement import BusyTimer
from lightning_hetero.ps.local_sgd import LOCAL_STEPS, LocalRounds, RoundBudget, check_weighting
from lightning_hetero.ps.outer_optimizer import OuterOptimizer

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from lightning_hetero.ps.bootstrap import FlatModel
    from lightning_hetero.ps.sampler import ClaimSampler

#: Local steps per rank and round when neither ``round_samples`` nor ``round_s`` is given (the round is then this
#: many batches times the number of ranks, split by speed).
DEFAULT_STEPS_PER_ROUND = 16


class LocalSGDMode:
    """Local SGD with an outer optimizer, as a mode of the strategy (see the module's docstring)."""

    # provided by AsyncPSStrategy
    world_size: int
    global_rank: int
    version: int
    _mode: str
    _flat_model: FlatModel | None
    _attached_trainer: pl.Trainer | None
    _claim_sampler: ClaimSampler | None
    _batch_share: Callable[[], float] | None
    optimizers: list[Any]
    lightning_module: Any
    root_device: torch.device

    def _init_local(
        self,
        round_samples: int | None,
        round_s: float | None,
        local_steps: str,
        outer_optimizer: Callable[..., torch.optim.Optimizer] | None,
        outer_optimizer_kwargs: dict[str, Any] | None,
        pseudo_gradient_weighting: str,
    ) -> None:
        """Validate the local mode's settings at construction (whatever the starting mode, since a switch may enter
        it later)."""
        if local_steps not in LOCAL_STEPS:
            raise ValueError(f"local_steps must be one of {LOCAL_STEPS}, got {local_steps!r}")
        check_weighting(pseudo_gradient_weighting)
        self._round_budget = (
            None if round_samples is None and round_s is None else RoundBudget(samples=round_samples, seconds=round_s)
        )
        self.local_steps = local_steps
        self.pseudo_gradient_weighting = pseudo_gradient_weighting
        self._outer = OuterOptimizer(outer_optimizer, outer_optimizer_kwargs)
        #: the local mode's round state (``None`` before setup); its ``plans``, ``rounds`` and ``bytes_sent`` tell
        #: what happened
        self.local_rounds: LocalRounds | None = None
        self._round_open = False
        self._local_announced = False
        self._busy_timer = BusyTimer(cpu_clock=None)  # no CPU-time floor in local SGD: one clock read less a step
        self._restored_local: dict[str, Any] | None = None

    def _setup_local(self, batch_size: int | None) -> None:
        """Build the round state once the world size (and, for the default round, the batch size) is known."""
        budget = self._round_budget
        if budget is None:
            budget = RoundBudget(samples=DEFAULT_STEPS_PER_ROUND * self.world_size * (batch_size or 1))
        self.local_rounds = LocalRounds(
            budget,
            self.global_rank,
            self.world_size,
            self._outer,
            self.local_steps,
            weighting=self.pseudo_gradient_weighting,
        )
        if self._restored_local is not None:
            self.local_rounds.load_state_dict(self._restored_local)
            self._restored_local = None

    def _check_local_supported(self) -> None:
        if self._batch_share is not None:
            raise ValueError(
                "AsyncPSStrategy(mode='local') does not support HeteroBatchCallback: in local SGD every rank already "
                "trains at its own speed (local_steps='proportional'); remove the callback or use BSP/ASP."
            )

    # ------------------------------------------------------------------ steps

    def _local_batch_start(self) -> None:
        """Before a local batch: open the round (the ranks' parameters agree here) and start timing the step."""
        assert self._flat_model is not None
        if self.local_rounds is None:
            self._setup_local(self._loader_batch_size())
        assert self.local_rounds is not None
        if not self._round_open:
            self.local_rounds.begin(self._flat_model.flat, self._loader_batch_size() or 1)
            self.local_rounds.steps_total = self.version  # global_step goes on from the previous mode's count
            self._round_open = True
            self._busy_timer.skip()
            self._set_claim_chunks(self.local_rounds.claim_chunks)
        self._local_step_s = self._busy_timer.step_start()
        self._local_batch_samples = self._batch_samples()

    def _local_optimizer_step(self, step: Callable[[], Any]) -> Any:
        """A local step with the rank's own optimizer; at the end of its share of the round, or of the epoch, the
        round-end all-reduce."""
        output = step()  # runs training_step, hence _local_batch_start
        rounds = self.local_rounds
        assert rounds is not None
        assert self._attached_trainer is not None
        last = is_last_batch(self._attached_trainer)
        share_done = rounds.record_step(self._local_batch_samples, self._local_step_s)
        if share_done or last:
            with self._busy_timer.waiting():
                outcome = self._end_round(done=last)
                while last and not outcome.all_done:
                    outcome = self._end_round(done=True)
            self._set_claim_chunks(rounds.claim_chunks)
            if last:  # every rank is done with the epoch: the next epoch's first batch begins a round
                self._busy_timer.skip()
                self._round_open = False
        self.version = rounds.steps_total
        self._set_step_counter(self.version, in_step=True)
        return output

    def _end_round(self, done: bool) -> Any:
        rounds = self.local_rounds
        assert rounds is not None and self._flat_model is not None
        flat = self._flat_model.flat
        buffers = self._float_buffers()
        flat_buffers = torch.cat([b.detach().reshape(-1) for b in buffers]) if buffers else None
        sampler = self._claim_sampler
        message = rounds.message(flat, flat_buffers, done, sampler.samples_left if sampler is not None else None)
        group = self._collective_group()
        self._collective(lambda: dist.all_reduce(message, op=dist.ReduceOp.SUM, group=group))
        outcome = rounds.apply(message, flat, flat_buffers)
        if flat_buffers is not None:
            offset = 0
            for buffer in buffers:
                buffer.copy_(flat_buffers[offset : offset + buffer.numel()].view_as(buffer))
                offset += buffer.numel()
        return outcome

    def _set_claim_chunks(self, chunks: int) -> None:
        """Claim this many batches at once from the epoch's pool (local SGD: a share of the round; other modes: 1)."""
        if self._claim_sampler is not None:
            self._claim_sampler.claim_chunks = chunks

    def _float_buffers(self) -> list[Tensor]:
        return [b for b in self.lightning_module.buffers() if b.is_floating_point()]

    def _loader_batch_size(self) -> int | None:
        return self._claim_sampler.chunk_size if self._claim_sampler is not None else None

    def _batch_samples(self) -> int:
        """Samples in the batch about to be trained: its chunk's size from the claim sampler (the epoch's last chunk may be
        short), else the loader's batch size."""
        sampler = self._claim_sampler
        if sampler is None:
            return 1
        chunk = sampler.next_chunk()
        if chunk < 0:
            return sampler.chunk_size
        return max(0, min(sampler.chunk_size, sampler.num_samples - chunk * sampler.chunk_size))

    # ------------------------------------------------------------------ switches

    def _enter_local(self) -> None:
        """At an epoch's end, from BSP or ASP: every rank starts the next round from the same parameters (from ASP,
        the server's, with its optimizer state, as when entering BSP)."""
        self._check_local_supported()
        self._round_open = False
        self._announce_local()

    def _announce_local(self) -> None:
        """Say once per local phase, on rank 0, how local SGD runs (a switch by ``SyncSwitchCallback`` before the
        strategy's own ``on_train_start`` enters the mode twice)."""
        if self._local_announced:
            return
        self._local_announced = True
        rank_zero_info(
            f"AsyncPSStrategy: local SGD, rounds of {self._round_description()}, local_steps={self.local_steps!r}, "
            f"pseudo_gradient_weighting={self.pseudo_gradient_weighting!r}, outer optimizer {self._outer.description}"
        )

    def _leave_local(self) -> None:
        """At an epoch's end (the ranks' parameters agree after the epoch's last round): the inner optimizers' states
        differ per rank, so rank 0's is given to all (BSP steps identical copies; ASP's server takes rank 0's)."""
        self._round_open = False
        self._local_announced = False
        self._set_claim_chunks(1)
        optimizer = self.optimizers[0]
        state = self._broadcast_unguarded(copy.deepcopy(optimizer.state_dict()) if self.global_rank == 0 else None, 0)
        optimizer.load_state_dict(state)
        optimizers_to_device(self.optimizers, self.root_device)

    def _round_description(self) -> str:
        budget = self._round_budget
        if budget is None:
            return f"{DEFAULT_STEPS_PER_ROUND} x {self.world_size} batches"
        return f"{budget.samples} samples" if budget.samples is not None else f"{budget.seconds:g} s"

    # ------------------------------------------------------------------ checkpoints

    def _local_state_into(self, state: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint's model state in local mode: the start-of-round parameters (the ranks' combined ones; equal to
        the model's at an epoch's end), not this rank's unfinished round."""
        rounds = self.local_rounds
        anchor = rounds.outer.anchor if rounds is not None else None
        if anchor is None or not self._round_open or self._flat_model is None:
            return state
        layout = self._flat_model.layout
        for name, value in zip(layout.names, layout.views(anchor), strict=True):
            state[name] = value.to(dtype=state[name].dtype).clone()
        return state

    def _local_checkpoint_state(self) -> dict[str, Any] | None:
        return self.local_rounds.state_dict() if self.local_rounds is not None else None

    def _restore_local(self, state: dict[str, Any] | None) -> None:
        if state is None:
            return
        if self.local_rounds is not None:
            self.local_rounds.load_state_dict(state)
        else:
            self._restored_local = state
        self._round_open = False
