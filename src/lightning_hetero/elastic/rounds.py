"""Elastic local SGD's rounds, pure torch: this worker's chunks, its round, its message to the round-end all-reduce
and what a committed (or failed) round does to the model, the outer optimizer and the :mod:`ledger
<lightning_hetero.elastic.ledger>`.

A round-end message is ``[w * (anchor - flat), w * buffers, samples, w, steps, trained chunks, held chunks, rate,
held count, history id and tag at this participant's slots]`` (``w``: the samples this worker trained in the round with
``weighting="samples"``, else 1 if it trained); the all-reduce sums it over the round's participants, whose number
and ranks the membership (torchft's quorum) gives per round. A newcomer takes part from the round it joins: it
contributes nothing to that one, receives its share of the next and, its speed unknown, the slowest worker's quota;
a round with a participant whose speed is unknown is half as long (:func:`~lightning_hetero.elastic.ledger.round_quotas`).
A round whose participants carry different history ids (two groups that committed the same steps apart) commits
nothing: see :mod:`~lightning_hetero.elastic.history`.

Example: two workers, one all-reduce simulated by a sum::

    >>> from lightning_hetero.local_sgd.outer_optimizer import OuterOptimizer
    >>> workers = [ElasticRounds(4, 2, OuterOptimizer(torch.optim.SGD, {"lr": 1.0})) for _ in range(2)]
    >>> params = [torch.zeros(2), torch.zeros(2)]
    >>> for worker, flat in zip(workers, params):
    ...     worker.begin(flat)
    >>> sums = sum(w.message(flat, None, rank, 2) for rank, (w, flat) in enumerate(zip(workers, params)))
    >>> [w.commit(sums.clone(), flat, None, rank, 2).samples for rank, (w, flat) in enumerate(zip(workers, params))]
    [0, 0]
    >>> list(workers[0].queue), list(workers[1].queue)  # the join round hands the 4 chunks out, one at a time
    ([0, 2], [1, 3])
    >>> params[0] += 1.0; workers[0].record_step(chunk=workers[0].take(), samples=8, step_s=0.1)  # quota: 1
    True
    >>> sums = sum(w.message(flat, None, rank, 2) for rank, (w, flat) in enumerate(zip(workers, params)))
    >>> outcome = [w.commit(sums.clone(), flat, None, rank, 2) for rank, (w, flat) in enumerate(zip(workers, params))]
    >>> outcome[0].samples, params[1], workers[1].ledger.counts.tolist()
    (8, tensor([1., 1.]), [1, 0, 0, 0])
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_hetero.elastic.history import ID_SLOTS, from_slots, new_tag, next_history, to_slots, winner
from lightning_hetero.elastic.ledger import EpochLedger, assign, round_quotas
from lightning_hetero.local_sgd.outer_optimizer import OuterOptimizer
from lightning_hetero.local_sgd.rounds import check_weighting
from lightning_hetero.measurement import ThroughputMeter


@dataclass(frozen=True)
class RoundResult:
    """What a round end did (committed, or refused because its participants' histories diverged)."""

    #: samples the participants trained in the round (0: no outer step)
    samples: int
    #: participants in the round
    participants: int
    #: the round completed the epoch (the ledger moved on to the next)
    epoch_done: bool
    #: chunks the round trained a second time (0 unless something is wrong)
    duplicates: int
    #: the chunks all participants trained in the round, as the ledger counted them (a chunk trained twice: twice)
    chunks: tuple[int, ...] = ()
    #: the participants carried different histories: nothing committed, every participant rolled back
    diverged: bool = False
    #: (``diverged``) this worker's history lost: it is to fall one step behind and recover from a peer
    behind: bool = False


class ElasticRounds:
    """One worker's side of elastic local SGD (see the module's docstring).

    Args:
        num_chunks: batches in an epoch.
        steps_per_round: local steps per participant and round, split by speed.
        outer: the outer optimizer.
        weighting: ``"mean"`` or ``"samples"`` (see :class:`~lightning_hetero.local_sgd.rounds.LocalRounds`).
    """

    def __init__(self, num_chunks: int, steps_per_round: int, outer: OuterOptimizer, weighting: str = "mean") -> None:
        check_weighting(weighting)
        self.ledger = EpochLedger(num_chunks)
        self.steps_per_round = steps_per_round
        self.outer = outer
        self.weighting = weighting
        self.meter = ThroughputMeter()
        #: chunks assigned to this worker and not taken by its loader yet, in order
        self.queue: deque[int] = deque()
        #: chunks taken by the loader and not trained yet (the batch prefetched while a round ends)
        self.taken: deque[int] = deque()
        #: chunks trained in the round in progress
        self.trained: list[int] = []
        self._dropped: set[int] = set()
        #: local steps to take in the round in progress
        self.quota = 1
        self.samples_in_round = 0
        #: local steps of all workers in committed rounds (``trainer.global_step``)
        self.steps_total = 0
        #: committed rounds that trained at least one sample
        self.rounds = 0
        #: the id of the job's history this worker's state belongs to (:mod:`~lightning_hetero.elastic.history`)
        self.history = 0
        #: this worker's random tag (in every message; part of the next history id)
        self.tag = new_tag()

    @property
    def held(self) -> list[int]:
        return [*self.taken, *self.queue]

    def begin(self, flat: Tensor) -> None:
        """Bind the outer optimizer to a copy of ``flat`` (the parameters every participant starts the round from)."""
        anchor = self.outer.anchor
        if anchor is None or anchor.shape != flat.shape:
            self.outer.bind(flat.detach().clone())
        else:
            anchor.copy_(flat.detach())

    def take(self) -> int | None:
        """The next chunk for the loader (``None``: none assigned now; the loader yields an idle batch)."""
        if not self.queue:
            return None
        chunk = self.queue.popleft()
        self.taken.append(chunk)
        return chunk

    def untake(self) -> None:
        """Chunks taken by a loader iteration that was abandoned before training them go back to the queue."""
        self.queue.extendleft(reversed(self.taken))
        self.taken.clear()

    def record_step(self, chunk: int, samples: int, step_s: float | None) -> bool:
        """Count the local step that trained ``chunk``; return whether this worker's quota for the round is done."""
        if chunk in self.taken:
            self.taken.remove(chunk)
        self.trained.append(chunk)
        self.samples_in_round += samples
        if step_s is not None:
            self.meter.update(samples, step_s)
        return len(self.trained) >= self.quota

    def message(self, flat: Tensor, buffers: Tensor | None, rank: int, participants: int) -> Tensor:
        """This worker's contribution to the round-end SUM all-reduce (see the module's docstring)."""
        anchor = self.outer.anchor
        if anchor is None:
            raise RuntimeError("ElasticRounds.message before begin")
        n = float(self.samples_in_round)
        weight = n if self.weighting == "samples" else float(n > 0)
        dtype = flat.dtype
        num_chunks = self.ledger.num_chunks
        parts = [(anchor - flat.detach()).mul_(weight).reshape(-1)]
        if buffers is not None:
            parts.append(buffers.detach().reshape(-1).to(dtype) * weight)
        trained = torch.zeros(num_chunks, dtype=dtype)
        trained[self.trained] = 1.0
        held = torch.zeros(num_chunks, dtype=dtype)
        held[self.held] = 1.0
        slots = torch.zeros((2 + 2 * ID_SLOTS) * participants, dtype=dtype)
        slots[rank] = self.meter.value or 0.0
        slots[participants + rank] = float(len(self.held))
        ids = 2 * participants + 2 * ID_SLOTS * rank
        slots[ids : ids + 2 * ID_SLOTS] = torch.tensor(to_slots(self.history) + to_slots(self.tag), dtype=dtype)
        counts = torch.tensor([n, weight, float(len(self.trained))], dtype=dtype)
        return torch.cat([*parts, counts, trained, held, slots])

    def commit(self, summed: Tensor, flat: Tensor, buffers: Tensor | None, rank: int, participants: int) -> RoundResult:
        """Apply a committed round's summed messages: the outer step, the parameters (and buffers) every worker
        continues from, the ledger, and this worker's chunks for the next round. Participants with different
        history ids commit nothing: each rolls back (:meth:`rollback`) and the result says whether it lost."""
        numel, buffer_numel, num_chunks = (
            flat.numel(),
            0 if buffers is None else buffers.numel(),
            self.ledger.num_chunks,
        )
        tail = summed[numel + buffer_numel :].cpu()
        samples, weight, steps = round(float(tail[0])), float(tail[1]), round(float(tail[2]))
        trained, held = tail[3 : 3 + num_chunks], tail[3 + num_chunks : 3 + 2 * num_chunks]
        slots = tail[3 + 2 * num_chunks :].tolist()
        rates, held_counts = slots[:participants], slots[participants : 2 * participants]
        ids = slots[2 * participants :]
        histories = [from_slots(ids[2 * ID_SLOTS * r : 2 * ID_SLOTS * r + ID_SLOTS]) for r in range(participants)]
        if len(set(histories)) > 1:
            self.rollback(flat)
            behind = self.history != winner(histories)
            return RoundResult(0, participants, False, 0, diverged=True, behind=behind)
        anchor = self.outer.anchor
        assert anchor is not None
        if samples > 0:
            self.outer.step((summed[:numel] / weight).to(flat.dtype))
            if buffers is not None:
                buffers.copy_((summed[numel : numel + buffer_numel] / weight).to(buffers.dtype))
            self.rounds += 1
        flat.detach().copy_(anchor)
        self.steps_total += steps
        counted = trained.round().to(torch.int64)
        chunks = tuple(chunk for chunk, n in enumerate(counted.tolist()) for _ in range(n))
        duplicates = self.ledger.commit(trained)
        self._end_round()
        # the id of the history this commit continues: everything summed but the rates (integers, equal everywhere)
        self.history = next_history(torch.cat([tail[: 3 + 2 * num_chunks], tail[3 + 2 * num_chunks + participants :]]))
        epoch_done = self.ledger.complete
        if epoch_done:
            self.ledger.next_epoch()
            self.queue.clear()
            self.taken.clear()
            held = torch.zeros_like(held)
            held_counts = [0.0] * participants
        quotas = round_quotas(rates, self.steps_per_round)
        shares = assign(self.ledger.free(held), quotas, [round(h) for h in held_counts])
        self.queue.extend(shares[rank])
        self.quota = quotas[rank]
        return RoundResult(samples, participants, epoch_done, duplicates, chunks)

    def rollback(self, flat: Tensor) -> None:
        """A round that did not commit: back to the start-of-round parameters; its chunks are trained again."""
        anchor = self.outer.anchor
        assert anchor is not None
        flat.detach().copy_(anchor)
        self.queue.extendleft(reversed(self.trained))
        self._end_round()

    def _end_round(self) -> None:
        self.trained = []
        self.samples_in_round = 0

    # ------------------------------------------------------------------ the state a newcomer fetches; checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The job's shared state apart from the model: ledger, outer optimizer, counters."""
        return {
            "ledger": self.ledger.state_dict(),
            "outer_optimizer": self.outer.state_dict(),
            "steps_total": self.steps_total,
            "rounds": self.rounds,
            "history": self.history,
        }

    def load_state_dict(self, state: dict[str, Any], flat: Tensor | None = None) -> None:
        """Take the job's state (from a peer or a checkpoint); with ``flat`` (the model's parameters, already
        loaded) the round restarts from them. The chunks this worker held are dropped: a job that went on without it
        has freed them, and the next commit frees those it did not (its fetched batches train as idle ones,
        :meth:`dropped`)."""
        self.ledger.load_state_dict(state["ledger"])
        self.outer.load_state_dict(state["outer_optimizer"])
        self.steps_total = int(state["steps_total"])
        self.rounds = int(state["rounds"])
        self.history = int(state.get("history", 0))  # a checkpoint from before history ids: the job's first
        self._dropped.update(self.taken)
        self.taken.clear()
        self.queue.clear()
        self._end_round()
        if flat is not None:
            self.begin(flat)

    def dropped(self, chunk: int) -> bool:
        """Whether the batch of ``chunk``, fetched before this worker took the job's state, is to train as an idle
        one (asked once per fetched batch)."""
        if chunk in self._dropped:
            self._dropped.discard(chunk)
            return True
        return False
