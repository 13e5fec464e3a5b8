"""Which history of the job a worker's state belongs to, so that a round never combines two.

torchft's lighthouse can form a round without any worker of the round before: at the job's start the first worker's
round end forms with it alone, and the workers started a moment later form theirs without it once they have waited
``join_timeout_s`` while it trains. Both groups then commit the same step, each from its own ledger, and hand the
same chunks out twice; torchft recovers a worker only when its step is behind, so when the two groups meet in one
round nobody recovers and the chunks both trained commit twice (6 batches in a benchmark run with
``join_timeout_s=2``).

Each worker therefore carries a *history id*: every committed round's id is a hash of what its all-reduce summed (the
chunks trained and held, the participants' ids and tags: the same on every participant), so two groups that
committed different rounds carry different ids. Every round-end message carries the participants' ids (and a random
*tag* per worker, so that two groups of new workers with equal rounds still differ); a round whose participants carry
more than one id commits nothing, the group of the :func:`winner` keeps its state and the others fall one step behind,
so that torchft recovers them from the winner's group at the next round end. An id travels in :data:`ID_SLOTS`
message slots of one byte each: exact in any float dtype.

Example::

    >>> slots = to_slots(0xABCDEF)
    >>> slots, from_slots(slots)
    ([171.0, 205.0, 239.0], 11259375)
    >>> winner([7, 3, 7, 3, 5])  # the largest group, ties to the smallest id
    3
    >>> next_history(torch.tensor([1.0, 0.0, 2.0])) == next_history(torch.tensor([1.0, 0.0, 2.0]))
    True
"""

from __future__ import annotations

import collections
import hashlib
import os

import torch
from torch import Tensor

#: message slots (bytes) of a history id or a tag
ID_SLOTS = 3


def to_slots(value: int) -> list[float]:
    """``value`` (``0 <= value < 2**24``) as :data:`ID_SLOTS` byte-valued floats, the most significant first."""
    return [float((value >> (8 * i)) & 0xFF) for i in reversed(range(ID_SLOTS))]


def from_slots(values: list[float]) -> int:
    """The id :func:`to_slots` encoded (a slot summed over the participants holds one worker's byte)."""
    result = 0
    for value in values:
        result = (result << 8) | (round(value) & 0xFF)
    return result


def next_history(summed: Tensor) -> int:
    """The history id after a commit: a hash of the round's summed message tail (rounded to integers; it holds the
    participants' previous id)."""
    data = summed.detach().cpu().round().to(torch.int64).contiguous().numpy().tobytes()
    return int.from_bytes(hashlib.sha1(data).digest()[:ID_SLOTS], "big")


def new_tag() -> int:
    """A random tag for a new worker (distinguishes groups of fresh workers whose rounds are otherwise equal)."""
    return int.from_bytes(os.urandom(ID_SLOTS), "big")


def winner(ids: list[int]) -> int:
    """The history a round of participants with different ``ids`` keeps: the one most participants carry (a tie goes
    to the smallest id, so every participant decides the same)."""
    counts = collections.Counter(ids)
    return min(counts, key=lambda value: (-counts[value], value))
