"""The epoch's ledger in elastic local SGD: which chunks (batches of the epoch's order) were trained, and who trains
which next, kept exact while workers come and go.

There is no shared claim counter: every round-end all-reduce carries, besides the pseudo-gradients, two chunk
vectors summed over the round's participants: the chunks each *trained* in the round and the chunks each still
*holds* (assigned and not trained yet). A round's trained chunks enter the ledger only when the round commits (its
outer step is taken), so a chunk counts as trained exactly when its pseudo-gradient reached the model. After the
commit every participant computes the same free chunks (neither trained nor held by a participant) and hands them
out with :func:`assign`, identically, by participant rank. A worker that left held chunks nobody reports any more:
they are free at the next commit and go to the members present. The ledger is part of the state a joining worker
fetches from a peer, so a newcomer shares it from its first round.

Example: chunk 2 was held by a worker that left; after the commit it is free again::

    >>> ledger = EpochLedger(num_chunks=4)
    >>> ledger.commit(torch.tensor([1.0, 1.0, 0.0, 0.0]))  # chunks 0 and 1 trained once: no duplicate
    0
    >>> ledger.free(held=torch.tensor([0.0, 0.0, 0.0, 1.0]))  # chunk 3 held by a member present
    [2]
    >>> ledger.complete, ledger.commit(torch.tensor([0.0, 1.0, 1.0, 1.0]))  # chunk 1 a second time: a duplicate
    (False, 1)
    >>> ledger.complete, ledger.lost
    (True, 0)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_hetero.allocation import apportion


class EpochLedger:
    """The chunks of the current epoch trained so far, with the counts that tell losses and duplicates.

    Args:
        num_chunks: chunks in an epoch (the training set's length over the batch size, rounded up).
    """

    def __init__(self, num_chunks: int) -> None:
        if num_chunks < 1:
            raise ValueError(f"an elastic epoch needs at least one batch, got num_chunks={num_chunks}")
        self.num_chunks = num_chunks
        #: the epoch the ledger counts
        self.epoch = 0
        #: how many committed rounds trained each chunk this epoch (1 each when the epoch is complete)
        self.counts = torch.zeros(num_chunks, dtype=torch.int64)
        #: chunks trained more than once, summed over the epochs
        self.duplicates = 0

    @property
    def complete(self) -> bool:
        """Every chunk of the epoch was trained in a committed round."""
        return bool((self.counts > 0).all())

    @property
    def lost(self) -> int:
        """Chunks of the epoch not trained yet (0 once :attr:`complete`)."""
        return int((self.counts == 0).sum())

    def commit(self, trained: Tensor) -> int:
        """Count a committed round's summed trained-chunk vector; return the chunks it trained a second time."""
        trained = trained.round().to(torch.int64).cpu()
        duplicates = int(((self.counts + trained) > 1).logical_and(trained > 0).sum())
        self.counts += trained
        self.duplicates += duplicates
        return duplicates

    def free(self, held: Tensor) -> list[int]:
        """The chunks neither trained this epoch nor ``held`` (the summed held-chunk vector), in the epoch's order."""
        taken = (self.counts > 0) | (held.round().cpu() > 0)
        return torch.nonzero(~taken).flatten().tolist()

    def next_epoch(self) -> None:
        self.epoch += 1
        self.counts.zero_()

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "counts": self.counts.clone(), "duplicates": self.duplicates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        counts = torch.as_tensor(state["counts"], dtype=torch.int64)
        if counts.numel() != self.num_chunks:
            raise ValueError(
                f"the elastic job's epoch has {counts.numel()} batches, this worker's has {self.num_chunks}: "
                "every worker needs the same training set and batch size"
            )
        self.epoch = int(state["epoch"])
        self.counts = counts.clone()
        self.duplicates = int(state["duplicates"])


def round_quotas(rates: list[float], steps_per_round: int) -> list[int]:
    """Local steps of each participant in the next round: ``steps_per_round`` per participant in all, split in
    proportion to the measured rates. A rate ``<= 0`` (a newcomer's, or everybody's at the job's start) counts as
    the slowest known one, and such a round is half as long (``ceil(steps_per_round / 2)`` per participant): it
    measures the speed, nobody waits long for a newcomer slower than expected, and the newcomer's first
    contribution commits half a round sooner.

    Example::

        >>> round_quotas([100.0, 100.0, 200.0, 400.0], steps_per_round=4)
        [2, 2, 4, 8]
        >>> round_quotas([100.0, 300.0, 0.0], steps_per_round=10)  # a newcomer: as the slowest, 100; half a round
        [3, 9, 3]
    """
    known = [rate for rate in rates if rate > 0]
    slowest = min(known) if known else 1.0
    weights = [rate if rate > 0 else slowest for rate in rates]
    n = len(rates)
    total = (steps_per_round if len(known) == n else -(-steps_per_round // 2)) * n
    return apportion(weights, total, lower=[1] * n, upper=[total] * n)


def assign(free: list[int], quotas: list[int], held: list[int]) -> list[list[int]]:
    """Hand ``free`` chunks out so that each participant holds one more than its quota (the batch the loader
    already fetched while the round ended), one chunk at a time in rank order, so a short tail is split evenly.

    Args:
        free: the free chunks, in the order they are handed out.
        quotas: each participant's local steps in the next round.
        held: chunks each participant still holds.

    Example::

        >>> assign(list(range(10)), quotas=[2, 4], held=[1, 0])
        [[0, 2], [1, 3, 4, 5, 6]]
        >>> assign([7, 8, 9], quotas=[2, 4], held=[0, 0])  # the epoch's tail
        [[7, 9], [8]]
    """
    wanted = [max(0, quota + 1 - have) for quota, have in zip(quotas, held, strict=True)]
    shares: list[list[int]] = [[] for _ in quotas]
    chunks = iter(free)
    while any(wanted):
        for rank, want in enumerate(wanted):
            if want == 0:
                continue
            chunk = next(chunks, None)
            if chunk is None:
                return shares
            shares[rank].append(chunk)
            wanted[rank] -= 1
    return shares
