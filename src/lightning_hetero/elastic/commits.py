"""What each committed round did, as a worker logs it, and the check that every chunk was trained once per epoch in
the job's history.

A worker's own log cannot say alone what reached the model: torchft decides the commit per worker, so a worker
killed between the round-end all-reduce and its log line leaves a committed round unlogged, and a worker whose
all-reduce completed while the others' failed (a participant died mid-collective) logs a commit that the job then
drops (the survivors redo the round; the lone committer dies, or fetches their state and goes on from it). The job's
history is the chain of commits the surviving parameters descend from: each :class:`CommitRecord` names the
parameters its round started from (``parent``, those of the step before) and those it produced (``digest``), so
:func:`lineage` walks back from a survivor's last commit, and :func:`epoch_coverage` counts, per epoch, the chunks
that history trained.

Example: step 2 was committed twice, by a worker that died (``"x"``) and then by the survivors (``"c"``)::

    >>> records = [
    ...     CommitRecord(epoch=0, step=1, chunks=(0,), round_chunks=(0, 1), parent="a", digest="b"),
    ...     CommitRecord(epoch=0, step=2, chunks=(2,), round_chunks=(2, 3), parent="b", digest="x"),
    ...     CommitRecord(epoch=0, step=2, chunks=(2,), round_chunks=(2, 3), parent="b", digest="c"),
    ...     CommitRecord(epoch=1, step=3, chunks=(), round_chunks=(1, 1), parent="c", digest="d"),
    ... ]
    >>> [record.digest for record in lineage(records, final=records[-1])]
    ['b', 'c', 'd']
    >>> epoch_coverage(lineage(records, final=records[-1]), num_chunks=4)
    {0: {'trained': 4, 'lost': 0, 'duplicated': 0}, 1: {'trained': 2, 'lost': 3, 'duplicated': 1}}
"""

from __future__ import annotations

import collections
import hashlib
from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class CommitRecord:
    """One committed round, as one of its participants saw it (``ElasticLocalSGDStrategy.on_commit``)."""

    #: the epoch the round's chunks belong to
    epoch: int
    #: torchft's step after the commit (committed rounds so far in the job's history)
    step: int
    #: the chunks this worker trained in the round
    chunks: tuple[int, ...]
    #: the chunks all participants trained in the round, as the ledger counted them (twice: a duplicate)
    round_chunks: tuple[int, ...]
    #: :func:`digest` of the parameters the round started from
    parent: str
    #: :func:`digest` of the parameters after the round's outer step
    digest: str
    #: samples all participants trained in the step, each counting its own (``ElasticHeteroBatchStrategy``: the
    #: global batch; 0 where not counted)
    samples: int = 0


def digest(flat: Tensor) -> str:
    """A short fingerprint of a parameter vector (bitwise: every worker of a commit computes the same one).

    Example::

        >>> import torch
        >>> digest(torch.zeros(3)) == digest(torch.zeros(3)) != digest(torch.ones(3))
        True
    """
    return hashlib.sha1(flat.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def lineage(records: list[CommitRecord], final: CommitRecord) -> list[CommitRecord]:
    """The commits up to ``final`` (a survivor's last) in the job's history, oldest first, one record per step.

    Raises:
        ValueError: the chain back to the job's first commit (step 1) has a gap (a step nobody logged).
    """
    by_node = {(record.step, record.digest): record for record in records}
    chain: list[CommitRecord] = []
    current: CommitRecord | None = final
    while current is not None:
        chain.append(current)
        current = by_node.get((current.step - 1, current.parent))
    chain.reverse()
    if chain[0].step != 1:
        raise ValueError(f"no logged commit of step {chain[0].step - 1} started the round of step {chain[0].step}")
    return chain


def epoch_coverage(chain: list[CommitRecord], num_chunks: int) -> dict[int, dict[str, int]]:
    """Per epoch of ``chain``: chunks ``trained``, chunks ``lost`` (never trained) and ``duplicated`` (more than once)."""
    counts: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for record in chain:
        counts[record.epoch].update(record.round_chunks)
    return {
        epoch: {
            "trained": sum(counter.values()),
            "lost": sum(1 for chunk in range(num_chunks) if counter[chunk] == 0),
            "duplicated": sum(1 for n in counter.values() if n > 1),
        }
        for epoch, counter in sorted(counts.items())
    }
