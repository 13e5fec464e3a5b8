"""Local SGD with an outer optimizer (DiLoCo), with each rank's local steps set by its measured speed.

Every rank trains its own copy of the model with its own (inner) optimizer for a *round*; at the round's end the
ranks meet in one all-reduce, combine their pseudo-gradients (start-of-round minus end-of-round parameters) and an
:class:`~lightning_hetero.local_sgd.outer_optimizer.OuterOptimizer` applies the result to the start-of-round parameters,
which every rank then continues from. The pseudo-gradients are combined as a plain mean over the ranks that trained
in the round (``weighting="mean"``, the default) or weighted by the samples each trained (``"samples"``): with
speed-proportional local steps the sample-weighted mean lets the fastest ranks' longer trajectories dominate.
Floating-point module buffers (BatchNorm running statistics) are averaged in the same all-reduce, weighted the same
way.

A round is a budget of samples over all ranks or of seconds (``round_length``). With ``local_steps="proportional"`` each
rank's share of it follows its measured throughput (:class:`~lightning_hetero.measurement.ThroughputMeter`, the
package's per-rank speed), exchanged in the round's all-reduce, so a fast rank takes more local steps and nobody waits
for a straggler (Async Local-SGD's "dynamic local updates"); ``"equal"`` gives every rank the same number (DiLoCo). Once
every rank's speed is known, a proportional round is a *deadline*: it lasts its seconds, or its samples over the ranks'
summed throughput, from the end of the previous round's all-reduce (which every rank leaves at about the same time), and
each rank stops at the step that ends closest to it. The ranks then arrive at the all-reduce within about half a step of
each other, however their speeds drift, where a step count planned from the last round's speeds lets them arrive as far
apart as the speeds changed (docs/results.md has the measurements).

The epoch's end: a rank whose share of the epoch is done meets the others with a *done* flag and no samples; it keeps
joining their round-end all-reduces (contributing nothing) until every rank is done, so the ranks always call the
same sequence of collectives although they train different numbers of batches.

This module is pure torch (the collective is the caller's): :meth:`LocalRounds.message` builds this rank's
contribution, the caller sums it over ranks, :meth:`LocalRounds.apply` applies the sum.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_hetero._validation import check_range
from lightning_hetero.local_sgd.local_stop import budgeted_plan
from lightning_hetero.local_sgd.outer_optimizer import OuterOptimizer
from lightning_hetero.local_sgd.round_plan import RoundBudget, check_local_steps, plan_local_steps
from lightning_hetero.measurement import ThroughputMeter

#: How the ranks' pseudo-gradients are combined: a plain mean over the ranks that trained, or weighted by samples.
WEIGHTINGS = ("mean", "samples")
#: Measured steps a rank leaves out of its speed at the start of training (allocator growth, cold caches).
WARMUP_STEPS = 3
#: A rank claims its expected steps in a round from the epoch's pool in about this many store round trips (the
#: epoch's tail aside, where claims shrink: :attr:`~lightning_hetero.async_ps.runtime.sampler.ClaimSampler.claim_chunks`).
CLAIMS_PER_ROUND = 1


def check_weighting(weighting: str) -> None:
    """Refuse an unknown pseudo-gradient weighting, naming the setting.

    Example::

        >>> check_weighting("samples")
        >>> check_weighting("steps")
        Traceback (most recent call last):
        ...
        ValueError: pseudo_gradient_weighting must be one of ('mean', 'samples'), got 'steps'
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"pseudo_gradient_weighting must be one of {WEIGHTINGS}, got {weighting!r}")


@dataclass(frozen=True)
class RoundOutcome:
    """What one round-end all-reduce concluded."""

    #: every rank flagged its epoch done: the epoch's last all-reduce
    all_done: bool
    #: samples the ranks trained in the round (0: no outer step was taken)
    samples: int
    #: local steps the ranks took in the round
    steps: int


class LocalRounds:
    """One rank's round state: the start-of-round parameters, its progress in the round, the outer optimizer.

    Args:
        budget: the round's length in samples or seconds (:meth:`~.round_plan.RoundBudget.in_samples`).
        rank: this rank's index in the all-reduce.
        world_size: ranks in the all-reduce.
        outer: the outer optimizer (default DiLoCo's Nesterov SGD).
        local_steps: ``"proportional"`` or ``"equal"`` (see :func:`plan_local_steps`).
        meter: this rank's throughput meter, updated once per round with the samples over the busy seconds of the
            round's measured steps (time-weighted: under a CPU quota a step's time jumps when a period is throttled,
            and a mean of per-step rates would count the unthrottled steps' rate as if they lasted as long); a given
            meter's warm-up counts rounds. Default: EWMA 0.3 after the first :data:`WARMUP_STEPS` measured steps.
        weighting: ``"mean"``: the combined pseudo-gradient is the plain mean over the ranks that trained in the
            round; ``"samples"``: weighted by the samples each trained.
        clock: seconds, for the deadline of a speed-proportional round (see :attr:`round_s`).

    Example: two ranks, simulated in one process (the all-reduce is a sum of the two messages)::

        >>> budget = RoundBudget(samples=4)
        >>> def averaging():
        ...     return OuterOptimizer(torch.optim.SGD, {"lr": 1.0})
        >>> ranks = [LocalRounds(budget, rank, 2, averaging(), weighting="samples") for rank in (0, 1)]
        >>> params = [torch.zeros(2), torch.zeros(2)]
        >>> for rounds, flat in zip(ranks, params):
        ...     rounds.begin(flat, batch_size=1)
        >>> rounds.target_steps  # 4 samples of 1 per round: 2 steps each until speeds are known
        2
        >>> params[0] += torch.tensor([1.0, 0.0]); ranks[0].record_step(samples=3, step_s=0.1)
        False
        >>> params[1] += torch.tensor([0.0, 1.0]); ranks[1].record_step(samples=1, step_s=0.1)
        False
        >>> total = sum(rounds.message(flat, done=False) for rounds, flat in zip(ranks, params))
        >>> [rounds.apply(total.clone(), flat) for rounds, flat in zip(ranks, params)][0]
        RoundOutcome(all_done=False, samples=4, steps=2)
        >>> params[0], params[1]  # the sample-weighted mean of the two ends (outer SGD with lr 1 = averaging)
        (tensor([0.7500, 0.2500]), tensor([0.7500, 0.2500]))

    With ``weighting="mean"`` the same round ends at the plain mean, ``[0.5, 0.5]``.
    """

    def __init__(
        self,
        budget: RoundBudget,
        rank: int,
        world_size: int,
        outer: OuterOptimizer | None = None,
        local_steps: str = "proportional",
        meter: ThroughputMeter | None = None,
        weighting: str = "mean",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        check_local_steps(local_steps)
        check_weighting(weighting)
        check_range("rank", rank, low=0, high=world_size, high_open=True, integer=True)
        self.budget = budget
        self.rank = rank
        self.world_size = world_size
        self.outer = outer if outer is not None else OuterOptimizer()
        self.local_steps = local_steps
        self.weighting = weighting
        self.meter = meter if meter is not None else ThroughputMeter(warmup_steps=0)
        self._busy = [0.0, 0.0]  # measured samples and busy seconds in the round
        self._warmup = WARMUP_STEPS if meter is None else 0
        #: each rank's throughput as of the last round's end (``None`` while unknown)
        self.rates: list[float | None] = [None] * world_size
        #: outer steps taken (rounds that trained at least one sample)
        self.rounds = 0
        #: local steps all ranks took up to the last round's end (``trainer.global_step`` in local mode)
        self.steps_total = 0
        #: ``max_steps`` for ``steps_total`` (-1: none): the last rounds are planned to end on it
        self.max_steps = -1
        #: bytes this rank sent in round-end all-reduces (its message's size per round end)
        self.bytes_sent = 0
        #: local steps each rank was planned for in each round (this rank's view), newest last
        self.plans: list[list[int]] = []
        self.clock = clock
        self.batch_size = 1
        #: this rank's local steps in the round when the round has no deadline
        self.target_steps = 1
        #: the round's deadline, seconds after its start: speed-proportional steps once every rank's speed is known
        #: (the budget's seconds, or its samples over the ranks' summed throughput); ``None``: ``target_steps`` ends it
        self.round_s: float | None = None
        #: this round runs to the epoch's end (its deadline ignored): when it started, fewer than 1.5 rounds' samples
        #: were left in the epoch (the smallest of the ranks' views of its pool, so every rank decides alike)
        self.to_epoch_end = False
        #: samples left in the epoch's pool at the last round end (the smallest of the ranks' views), else ``None``
        self.epoch_left: int | None = None
        self.steps_in_round = 0
        self.samples_in_round = 0
        self._round_start = 0.0
        self._slack = 0.0  # half the fastest rank's step: how far past the deadline a rank's last step may end
        self._message: Tensor | None = None  # the round-end message's buffer (see message)

    def progress(self) -> int:
        """The local steps all ranks took so far, as this rank can tell mid-round: the count at the round's start plus
        its own steps in the round scaled by the round's plan (every rank's planned steps over its own); exact at a
        round's end. A step-interval learning-rate schedule stepped by it follows the job, not the rank.

        Example::

            >>> rounds = LocalRounds(RoundBudget(samples=8), rank=0, world_size=2)
            >>> rounds.steps_total, rounds.plans, rounds.target_steps, rounds.steps_in_round = 10, [[6, 2]], 6, 3
            >>> rounds.progress()  # half of this rank's 6 steps: half of the round's 8
            14
        """
        plan = self.plans[-1] if self.plans else None
        if not plan or self.target_steps <= 0:
            return self.steps_total
        total = sum(plan)
        return self.steps_total + min(total, self.steps_in_round * total // self.target_steps)

    def begin(self, flat: Tensor, batch_size: int) -> None:
        """Start a round from ``flat`` (this rank's flat parameters, the same on every rank here)."""
        check_range("batch_size", batch_size, low=0, low_open=True)
        self.batch_size = batch_size
        self.epoch_left = None
        anchor = self.outer.anchor
        if anchor is None or anchor.shape != flat.shape or anchor.dtype != flat.dtype or anchor.device != flat.device:
            self.outer.bind(flat.detach().clone())
        else:
            anchor.copy_(flat.detach())
        self._start_round()

    def _start_round(self) -> None:
        self.steps_in_round = 0
        self.samples_in_round = 0
        plan = plan_local_steps(self.budget, self.batch_size, self.rates, self.local_steps)
        left = self.max_steps - self.steps_total if self.max_steps >= 0 else None
        budgeted = budgeted_plan(plan, self.rates, left, self.local_steps == "proportional")
        self.plans.append(budgeted or plan)
        self.target_steps = (budgeted or plan)[self.rank]
        self.round_s = self._deadline() if budgeted is None else None
        if self.round_s is not None:
            self._slack = self.batch_size / max(self.rates) / 2  # type: ignore[type-var, operator]
        self.to_epoch_end = (
            self.round_s is not None
            and self.epoch_left is not None
            and self.epoch_left < 1.5 * self.round_s * sum(self.rates)  # type: ignore[arg-type]
        )
        self._round_start = self.clock()

    @property
    def claim_chunks(self) -> int:
        """Batches this rank claims at once from the epoch's pool in this round: its planned steps over
        :data:`CLAIMS_PER_ROUND`, at least one (see :attr:`~lightning_hetero.async_ps.runtime.sampler.ClaimSampler.claim_chunks`).

        Example::

            >>> rounds = LocalRounds(RoundBudget(samples=64), 0, 2)
            >>> rounds.rates = [300.0, 100.0]
            >>> rounds.begin(torch.zeros(1), batch_size=2)
            >>> rounds.target_steps, rounds.claim_chunks  # 24 of the round's 32 steps, claimed at once
            (24, 24)
        """
        return max(1, self.target_steps // CLAIMS_PER_ROUND)

    def _deadline(self) -> float | None:
        rates = self.rates
        if self.local_steps != "proportional" or not all(rate is not None and rate > 0 for rate in rates):
            return None
        if self.budget.seconds is not None:
            return self.budget.seconds
        return self.budget.samples / sum(rates)  # type: ignore[arg-type, operator]

    def record_step(self, samples: int, step_s: float | None) -> bool:
        """Count one local step of ``samples`` that took ``step_s`` busy seconds (``None``: not measured); return
        whether this rank's share of the round is done: its ``target_steps`` taken, or, with a deadline
        (:attr:`round_s`), another step of the round's mean length would end more than half a step of the fastest
        rank past it. The fastest rank then stops at the step that ends closest to the deadline and a slower one at
        its last step that ends before that (its longer steps would keep the faster ranks waiting at the round's
        end, which costs them more samples than a slow rank's early stop costs it: a rank's step is one batch
        whatever its speed). A round with a deadline that started with less than 1.5 rounds left in the epoch
        (:attr:`to_epoch_end`, the same on every rank) is not done before the epoch's end: a short last round
        would cost a round-end all-reduce of its own.

        Example: a deadline of 0.1 s, steps of 30 ms::

            >>> clock = iter([0.0, 0.03, 0.06, 0.09]).__next__
            >>> rounds = LocalRounds(RoundBudget(seconds=0.1), 0, 1, clock=clock)
            >>> rounds.rates = [1000.0]
            >>> rounds.begin(torch.zeros(1), batch_size=30)
            >>> [rounds.record_step(30, 0.03) for _ in range(3)]  # 0.09 + 0.015 > 0.1: the third step ends it
            [False, False, True]

        A rank with steps of 36 ms beside one with steps of 10 ms stops after two steps: a third would end at
        0.108 s, nearer the deadline than 0.072 s but more than 5 ms past it::

            >>> clock = iter([0.0, 0.036, 0.072]).__next__
            >>> rounds = LocalRounds(RoundBudget(seconds=0.1), 1, 2, clock=clock)
            >>> rounds.rates = [3600.0, 1000.0]
            >>> rounds.begin(torch.zeros(1), batch_size=36)
            >>> [rounds.record_step(36, 0.036) for _ in range(2)]
            [False, True]
        """
        self.steps_in_round += 1
        self.samples_in_round += samples
        if step_s is not None and step_s > 0:
            if self._warmup > 0:
                self._warmup -= 1
            else:
                self._busy = [self._busy[0] + samples, self._busy[1] + step_s]
        if self.round_s is None:
            return self.steps_in_round >= self.target_steps
        if self.to_epoch_end:
            return False
        elapsed = self.clock() - self._round_start
        return elapsed + elapsed / self.steps_in_round - self._slack >= self.round_s

    def message(
        self, flat: Tensor, buffers: Tensor | None = None, done: bool = False, epoch_left: int | None = None
    ) -> Tensor:
        """This rank's contribution to the round-end SUM all-reduce, in ``flat``'s dtype and device: ``[w * (anchor -
        flat), w * buffers, n, w, steps, done, rate at this rank's slot, epoch_left + 1 at this rank's slot]`` with
        ``n`` the samples it trained in the round, ``w`` its weight (``"samples"``: ``n``; ``"mean"``: 1 if it trained,
        else 0) and ``epoch_left`` the samples it last saw left in the epoch's pool (``None``: unknown, sent as 0).
        Sample counts stay exact in float32 up to 2**24 per round.

        The message is written into one buffer kept from round to round (no allocation of the model's size per
        round end), so the tensor returned is overwritten by the next call; :meth:`apply` may take it all-reduced in
        place."""
        anchor = self.outer.anchor
        if anchor is None:
            raise RuntimeError("LocalRounds.message before begin")
        if self._busy[1] > 0:
            self.meter.update(round(self._busy[0]), self._busy[1])
        self._busy = [0.0, 0.0]
        n = float(self.samples_in_round)
        weight = n if self.weighting == "samples" else float(n > 0)
        rates, lefts = [0.0] * self.world_size, [0.0] * self.world_size
        rates[self.rank] = self.meter.value or 0.0
        lefts[self.rank] = 0.0 if epoch_left is None else epoch_left + 1.0
        tail = [n, weight, float(self.steps_in_round), 1.0 if done else 0.0, *rates, *lefts]
        numel, buffer_numel = flat.numel(), 0 if buffers is None else buffers.numel()
        message = self._message_buffer(flat, numel + buffer_numel + len(tail))
        torch.sub(anchor.reshape(-1), flat.detach().reshape(-1), out=message[:numel])
        if buffers is not None:
            message[numel : numel + buffer_numel].copy_(buffers.detach().reshape(-1))
        if weight != 1.0:
            message[: numel + buffer_numel].mul_(weight)
        message[numel + buffer_numel :].copy_(torch.tensor(tail, dtype=message.dtype))
        self.bytes_sent += message.numel() * message.element_size()
        return message

    def _message_buffer(self, flat: Tensor, numel: int) -> Tensor:
        """The round-end message's buffer: the one kept if it still fits ``flat``'s dtype, device and ``numel``."""
        buffer = self._message
        if buffer is None or buffer.numel() != numel or buffer.dtype != flat.dtype or buffer.device != flat.device:
            buffer = self._message = torch.empty(numel, dtype=flat.dtype, device=flat.device)
        return buffer

    def apply(self, summed: Tensor, flat: Tensor, buffers: Tensor | None = None) -> RoundOutcome:
        """Apply the all-reduced messages: the outer step on the anchor, ``flat`` (and ``buffers``) overwritten with
        the combined parameters (and the weighted mean buffers), the next round started (unless every rank is done:
        the next epoch's first batch begins it, :meth:`begin`, so that no deadline runs during validation).
        ``summed`` is used in place (divided by the summed weight)."""
        numel = flat.numel()
        buffer_numel = 0 if buffers is None else buffers.numel()
        tail = summed[numel + buffer_numel :].cpu()
        samples, steps, done = (round(float(tail[i])) for i in (0, 2, 3))
        weight = float(tail[1])
        anchor = self.outer.anchor
        assert anchor is not None
        if samples > 0:
            combined = summed[: numel + buffer_numel]
            if weight != 1.0:
                combined.div_(weight)
            self.outer.step(combined[:numel])
            if buffers is not None:
                buffers.copy_(combined[numel:])
            self.rounds += 1
        flat.detach().copy_(anchor)
        for rank, rate in enumerate(tail[4 : 4 + self.world_size].tolist()):
            if rate > 0:
                self.rates[rank] = rate
        lefts = [round(left) - 1 for left in tail[4 + self.world_size :].tolist() if left > 0]
        self.epoch_left = min(lefts) if lefts else None
        self.steps_total += steps
        all_done = done >= self.world_size
        if not all_done:
            self._start_round()
        return RoundOutcome(all_done=all_done, samples=samples, steps=steps)

    def state_dict(self) -> dict[str, Any]:
        """Round state for checkpoints: outer optimizer, rounds, step total, rates (the anchor is the model's
        parameters a checkpoint saves)."""
        return {
            "rounds": self.rounds,
            "steps_total": self.steps_total,
            "rates": list(self.rates),
            "outer_optimizer": self.outer.state_dict(),
            "meter": self.meter.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds = int(state["rounds"])
        self.steps_total = int(state["steps_total"])
        rates = list(state["rates"])
        self.rates = rates if len(rates) == self.world_size else [None] * self.world_size
        self.outer.load_state_dict(state["outer_optimizer"])
        self.meter.load_state_dict(state["meter"])
