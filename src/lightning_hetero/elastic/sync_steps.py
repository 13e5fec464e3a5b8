"""The synchronous elastic job's steps, pure torch: which global batch a step trains, how it is split over the step's
participants, what each sends to the step's all-reduces and what a committed step does to the epoch's ledger.

A step trains one *chunk*: a global batch of the epoch's order (the training loader's ``batch_size`` samples, the
same on every worker). It has two SUM all-reduces over the participants torchft's quorum gives:

1. the *exchange*: each participant's measured speed and its history id and tag (:mod:`~lightning_hetero.elastic.history`)
   at its rank's slots. Every participant then computes the same split (:func:`step_split`) and the same chunk;
2. the *gradient*: each participant's local-mean gradient times its batch share ``b_k / B`` (and its float buffers
   times the same share), and its sample count. The sum is the global batch's mean gradient, exactly.

A step commits only where every participant finished (torchft's ``should_commit``); then the chunk enters the
ledger. A step that does not commit leaves the ledger as it was, so the same chunk is trained again, split over the
next quorum: a committed step never mixes memberships, and every sample is trained once per epoch.

A worker that joins takes part in one step with a share of 0 (it only fetches the job's state from a peer at that
step's quorum, and learns the job's epoch); its speed is then unknown, so it trains the slowest known share until
measured.

Example: two workers, the all-reduces simulated by sums::

    >>> workers = [SyncSteps(num_samples=10, global_batch_size=4, shuffle=False, seed=0) for _ in range(2)]
    >>> for worker in workers:
    ...     worker.joining = False
    >>> workers[0].meter.value, workers[1].meter.value = 100.0, 300.0
    >>> exchanged = sum(w.exchange_message(rank, 2) for rank, w in enumerate(workers))
    >>> plans = [w.plan(exchanged, rank, 2) for rank, w in enumerate(workers)]
    >>> plans[0].split, plans[0].indices, plans[1].indices
    ((1, 3), [0], [1, 2, 3])
    >>> summed = sum(w.message(torch.ones(2), None, plan) for w, plan in zip(workers, plans))
    >>> summed  # the shares' weighted gradients sum to the global batch's; 4 samples trained
    tensor([1., 1., 4.])
    >>> [w.commit(summed, plan).samples for w, plan in zip(workers, plans)], workers[0].ledger.counts.tolist()
    ([4, 4], [1, 0, 0])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_hetero.allocation import apportion
from lightning_hetero.batch_weighting import batch_share, gradient_weight
from lightning_hetero.elastic.history import ID_SLOTS, from_slots, new_tag, next_history, to_slots, winner
from lightning_hetero.elastic.ledger import EpochLedger
from lightning_hetero.elastic.membership import ElasticError
from lightning_hetero.epoch_order import epoch_order
from lightning_hetero.measurement import ThroughputMeter

#: the speed a joining participant sends in the exchange: it trains nothing in the step it joins at
JOINING = -1.0


def step_split(rates: list[float], global_batch: int) -> list[int]:
    """Samples of each participant in a step: ``global_batch`` split in proportion to the measured ``rates``. A rate of
    0 (not measured yet) counts as the slowest known one; a :data:`JOINING` participant gets 0.

    Example::

        >>> step_split([100.0, 300.0], 8), step_split([100.0, 300.0, 0.0], 10)  # a newcomer: as the slowest
        ([2, 6], [2, 6, 2])
        >>> step_split([100.0, JOINING], 8), step_split([0.0, 0.0, 0.0], 2)  # more members than samples: some get 0
        ([8, 0], [1, 1, 0])
    """
    members = [rate != JOINING for rate in rates]
    known = [rate for rate in rates if rate > 0]
    slowest = min(known) if known else 1.0
    weights = [(rate if rate > 0 else slowest) if member else 0.0 for rate, member in zip(rates, members, strict=True)]
    if not any(members):
        return [0] * len(rates)
    floor = 1 if global_batch >= sum(members) else 0
    lower = [floor if member else 0 for member in members]
    upper = [global_batch if member else 0 for member in members]
    return apportion(weights, global_batch, lower=lower, upper=upper)


@dataclass(frozen=True)
class StepPlan:
    """One step as its quorum decided it, the same on every participant but for ``rank`` and ``indices``."""

    #: the epoch and the chunk (global batch) the step trains
    epoch: int
    chunk: int
    #: samples of each participant, by rank (sums to the chunk's samples)
    split: tuple[int, ...]
    #: this participant's rank and its samples (dataset indices)
    rank: int
    indices: list[int]
    #: nobody in the step trains (every participant is joining): the step is not to commit
    empty: bool = False
    #: the participants carry different histories: the step is not to commit
    diverged: bool = False
    #: (``diverged``) this worker's history lost: it falls one step behind and recovers from a peer
    behind: bool = False
    #: the participants' history ids and tags, by rank (what the next history id hashes)
    ids: tuple[float, ...] = ()

    @property
    def weight(self) -> float:
        """The factor of this participant's local-mean gradient in the step's sum: its batch share."""
        return gradient_weight(batch_share(self.split, self.rank)) if sum(self.split) else 0.0


@dataclass(frozen=True)
class StepResult:
    """What a committed step did."""

    #: samples the participants trained, counted by each and summed (the chunk's samples)
    samples: int
    #: the step completed the epoch (the ledger moved on to the next)
    epoch_done: bool
    #: the step trained its chunk a second time in the epoch (0 unless something is wrong)
    duplicates: int


class SyncSteps:
    """One worker's side of the synchronous elastic job (see the module's docstring).

    Args:
        num_samples: the training set's length.
        global_batch_size: samples per step, over all participants (the training loader's batch size).
        shuffle: a new order each epoch (the same on every worker).
        seed: the order's seed.
    """

    def __init__(self, num_samples: int, global_batch_size: int, shuffle: bool, seed: int) -> None:
        if num_samples < 1 or global_batch_size < 1:
            raise ValueError(
                f"need num_samples >= 1 and global_batch_size >= 1, got {num_samples}, {global_batch_size}"
            )
        self.num_samples = num_samples
        self.global_batch_size = global_batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.ledger = EpochLedger(-(-num_samples // global_batch_size))
        #: this worker's samples per second (forward and backward of its share)
        self.meter = ThroughputMeter()
        #: the next step is this worker's join step (a share of 0)
        self.joining = True
        #: committed steps of the job (``trainer.global_step``)
        self.steps_total = 0
        self.history = 0
        self.tag = new_tag()
        self._order: tuple[int, list[int]] = (-1, [])

    @property
    def chunk(self) -> int:
        """The chunk the next step trains: the epoch's first not trained yet."""
        return int(torch.nonzero(self.ledger.counts == 0).flatten()[0])

    @property
    def steps_done(self) -> int:
        """Committed steps of the current epoch."""
        return int((self.ledger.counts > 0).sum())

    def chunk_samples(self, chunk: int) -> int:
        """Samples in ``chunk`` (the epoch's last may be short)."""
        return min(self.global_batch_size, self.num_samples - chunk * self.global_batch_size)

    def chunk_indices(self, epoch: int, chunk: int) -> list[int]:
        """The dataset indices of ``chunk`` in ``epoch``'s order."""
        if self._order[0] != epoch:  # one permutation per epoch, not per step
            self._order = (epoch, epoch_order(self.num_samples, epoch, self.shuffle, self.seed))
        return self._order[1][chunk * self.global_batch_size : (chunk + 1) * self.global_batch_size]

    def exchange_message(self, rank: int, participants: int) -> Tensor:
        """This worker's part of the exchange: ``[rates by rank, (history id, tag) by rank]``."""
        slots = torch.zeros((1 + 2 * ID_SLOTS) * participants, dtype=torch.float64)
        slots[rank] = JOINING if self.joining else (self.meter.value or 0.0)
        ids = participants + 2 * ID_SLOTS * rank
        slots[ids : ids + 2 * ID_SLOTS] = torch.tensor(to_slots(self.history) + to_slots(self.tag), dtype=torch.float64)
        return slots

    def plan(self, exchanged: Tensor, rank: int, participants: int) -> StepPlan:
        """The step from the summed exchange: the chunk, the split, this worker's samples."""
        values = exchanged.tolist()
        rates, ids = values[:participants], values[participants:]
        histories = [from_slots(ids[2 * ID_SLOTS * r : 2 * ID_SLOTS * r + ID_SLOTS]) for r in range(participants)]
        epoch, chunk = self.ledger.epoch, self.chunk
        if len(set(histories)) > 1:
            behind = self.history != winner(histories)
            return StepPlan(epoch, chunk, (0,) * participants, rank, [], diverged=True, behind=behind)
        indices = self.chunk_indices(epoch, chunk)
        split = step_split(rates, len(indices))
        start = sum(split[:rank])
        mine = indices[start : start + split[rank]]
        return StepPlan(epoch, chunk, tuple(split), rank, mine, empty=sum(split) == 0, ids=tuple(ids))

    def message(self, grads: Tensor, buffers: Tensor | None, plan: StepPlan) -> Tensor:
        """This worker's part of the gradient all-reduce: ``[share * grads, share * buffers, samples]``."""
        weight = plan.weight
        parts = [grads.detach().reshape(-1) * weight]
        if buffers is not None:
            parts.append(buffers.detach().reshape(-1).to(grads.dtype) * weight)
        parts.append(torch.tensor([float(len(plan.indices))], dtype=grads.dtype))
        return torch.cat(parts)

    def record(self, samples: int, compute_s: float) -> None:
        """This worker's forward and backward of ``samples`` took ``compute_s`` (its measured speed)."""
        self.meter.update(samples, compute_s)

    def commit(self, summed: Tensor, plan: StepPlan) -> StepResult:
        """Count a committed step: the chunk enters the ledger, the history moves on; the epoch ends with its last
        chunk. (The gradient in ``summed[:-1]`` is the caller's to apply.)"""
        samples = round(float(summed[-1]))
        trained = torch.zeros(self.ledger.num_chunks)
        trained[plan.chunk] = 1.0
        duplicates = self.ledger.commit(trained)
        self.steps_total += 1
        self.history = next_history(torch.tensor([*plan.ids, plan.epoch, plan.chunk, samples], dtype=torch.float64))
        self.joining = False
        epoch_done = self.ledger.complete
        if epoch_done:
            self.ledger.next_epoch()
        return StepResult(samples, epoch_done, duplicates)

    # ------------------------------------------------------------------ the state a newcomer fetches; checkpoints

    def data_signature(self) -> dict[str, Any]:
        return {
            "num_samples": self.num_samples,
            "global_batch_size": self.global_batch_size,
            "shuffle": self.shuffle,
            "seed": self.seed,
        }

    def state_dict(self) -> dict[str, Any]:
        """The job's shared state apart from the model: the data's signature, the ledger, the counters."""
        return {
            "data": self.data_signature(),
            "ledger": self.ledger.state_dict(),
            "steps_total": self.steps_total,
            "history": self.history,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the job's state (from a peer or a checkpoint).

        Raises:
            ElasticError: the job's data differs from this worker's (the first difference named).
        """
        for name, value in state["data"].items():
            own = self.data_signature()[name]
            if own != value:
                raise ElasticError(
                    f"this worker cannot join the elastic job: its data differs: {name} is {own!r} here and "
                    f"{value!r} in the running job"
                )
        self.ledger.load_state_dict(state["ledger"])
        self.steps_total = int(state["steps_total"])
        self.history = int(state["history"])
