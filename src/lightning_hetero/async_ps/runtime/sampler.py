"""Epoch coverage across workers of different speeds: a sampler whose chunks of indices are claimed on demand.

In asynchronous mode each worker claims its next chunk (one batch worth of indices; or a few at once, see
``ClaimSampler.claim_chunks``) from a shared atomic counter when it needs one (its first chunk of an epoch is
reserved, so nobody ends an epoch empty-handed), so a fast worker takes more batches, a slow one fewer, and the
epoch still visits every sample exactly once; the epoch ends for everybody when the counter passes the end of the
data. In synchronous mode the chunks are dealt round-robin (padded by wrapping, like ``DistributedSampler``) so
every rank makes the same number of steps, which the all-reduce requires.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterator, Mapping

from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import Sampler

from lightning_hetero._validation import check_range
from lightning_hetero.epoch_order import epoch_order as epoch_order  # re-exported: the old import path

#: ``claim(epoch, count[, segment]) -> start``: atomically reserve ``count`` positions of the epoch's claims (of its
#: segment ``segment`` when the epoch has validation points); return the first.
ClaimFn = Callable[..., int]
#: ``tail(epoch, own_chunks) -> chunks``: once the claims run out, the chunks this worker must still train (the ones
#: a lost worker had claimed but not pushed); may block until the other workers are done with the epoch.
TailFn = Callable[[int, set[int]], list[int]]


def tail_claim(claim_chunks: int, samples_left: int, chunk_size: int, world_size: int, share: float | None) -> int:
    """Chunks one claim takes: ``claim_chunks``, but at most half of this rank's share of the ``samples_left`` it last
    saw (``share``: its throughput over all ranks'; ``None``: ``1 / world_size``), at least one. Near the epoch's end a
    claim is then trained in about half the time the ranks take to drain what is left, so a slow rank does not hold
    batches while the fast ones run dry.

    Args:
        claim_chunks: the chunks the rank would claim at once (:attr:`ClaimSampler.claim_chunks`).
        samples_left: samples of the pool nobody had claimed at the rank's last claim.
        chunk_size: samples per chunk.
        world_size: ranks claiming from the pool.
        share: this rank's share of the ranks' summed throughput, in (0, 1]; ``None``: equal shares.

    Example: 64 chunks of 32 samples left, 4 ranks::

        >>> tail_claim(20, 64 * 32, 32, 4, None), tail_claim(20, 64 * 32, 32, 4, 0.5), tail_claim(20, 64 * 32, 32, 4, 0.1)
        (8, 16, 3)
        >>> tail_claim(20, 64 * 32, 32, 4, 1.0), tail_claim(5, 0, 32, 4, 0.5)  # at most claim_chunks, at least one
        (20, 1)
    """
    share = 1.0 / world_size if share is None else share
    return max(1, min(claim_chunks, int(samples_left * share / (2 * chunk_size) + 1e-9)))


def stops_claiming(held: int, samples_left: int, chunk_size: int, world_size: int, share: float, lead: float) -> bool:
    """Whether a rank that is not the fastest stops claiming near the epoch's end: one more chunk would end its part
    of the epoch more than half a step of the fastest rank after all ranks together would drain what is left. That
    is ``samples_left``, the ``held`` batches this rank has yet to train, one and a half batches of each other rank
    (the one in training, the one its loader fetched ahead) and what the others claimed and hold, counted as half of
    their share of ``samples_left`` (a claim takes at most that, :func:`tail_claim`). The faster ranks train the
    rest; the fastest never stops, so the epoch still covers every sample.

    Args:
        held: batches this rank holds and has not started (the loader's batch fetched ahead).
        samples_left: samples of the pool nobody had claimed (as this rank last saw it).
        chunk_size: samples per chunk.
        world_size: ranks claiming from the pool.
        share: this rank's share of the ranks' summed throughput, in (0, 1].
        lead: the fastest rank's share.

    Example: a rank with a tenth of the speed beside one with half of it, one batch held, 4 ranks::

        >>> stops_claiming(1, 64 * 32, 32, 4, 0.1, 0.5), stops_claiming(1, 8 * 32, 32, 4, 0.1, 0.5)
        (False, True)
        >>> stops_claiming(1, 8 * 32, 32, 4, 0.5, 0.5)  # the fastest rank always claims
        False
    """
    if share >= lead:
        return False
    work = samples_left * (1 + (1 - share) / 2) + (held + 1.5 * (world_size - 1)) * chunk_size
    return held + 1 > share * work / chunk_size + share / (2 * lead)


def round_robin_chunks(num_samples: int, chunk_size: int, rank: int, world_size: int) -> list[tuple[int, int]]:
    """``(start, stop)`` positions of the chunks rank ``rank`` gets in synchronous mode; equal counts on all ranks.

    Args:
        num_samples: dataset length.
        chunk_size: positions per chunk (the local batch size).
        rank: this worker's rank.
        world_size: number of workers.

    Example::

        >>> round_robin_chunks(10, 3, rank=0, world_size=2), round_robin_chunks(10, 3, rank=1, world_size=2)
        ([(0, 3), (6, 9)], [(3, 6), (9, 10)])
        >>> round_robin_chunks(7, 3, rank=1, world_size=2)  # padded by wrapping around
        [(3, 6), (0, 3)]
    """
    num_chunks = -(-num_samples // chunk_size)
    per_rank = -(-num_chunks // world_size)
    chunks = []
    for i in range(per_rank):
        index = (rank + i * world_size) % num_chunks
        chunks.append((index * chunk_size, min(num_samples, (index + 1) * chunk_size)))
    return chunks


class ClaimSampler(Sampler[int]):
    """Yields dataset indices chunk by chunk: claimed on demand (asynchronous mode) or dealt round-robin (synchronous).

    It has no ``__len__`` on purpose: in asynchronous mode a worker's share of the epoch is only known at its end.

    Args:
        num_samples: dataset length.
        chunk_size: indices per claim; set it to the loader's batch size (the same on every rank) so batches never
            straddle claims.
        claim: the shared atomic counter, see :data:`ClaimFn`.
        epoch: returns the current epoch number when an iteration starts.
        asynchronous: returns whether the strategy trains asynchronously when an iteration starts.
        rank: this worker's rank (synchronous mode).
        world_size: number of workers (synchronous mode).
        shuffle: visit the data in a new random order each epoch.
        seed: base seed, identical on all workers.
        tail: asynchronous mode: asked for more chunks once the claims run out, see :data:`TailFn` (the parameter
            server's rank returns a lost worker's chunks there, so the epoch still covers every sample once).
        reserved_only: asynchronous mode: returns, when an iteration starts, whether this rank yields only its
            reserved first chunk and claims none (a dedicated server rank); ``tail`` is still asked after it.
        pool_chunks: the epoch covers only the first this many chunks of its order (``limit_train_batches``;
            ``None``: all of them).

    Example::

        >>> counter = {}
        >>> def claim(epoch, count):
        ...     start = counter.get(epoch, 0)
        ...     counter[epoch] = start + count
        ...     return start
        >>> fast = ClaimSampler(5, 2, claim, epoch=lambda: 0, asynchronous=lambda: True, rank=0, world_size=2)
        >>> slow = ClaimSampler(5, 2, claim, epoch=lambda: 0, asynchronous=lambda: True, rank=1, world_size=2)
        >>> fast_iter, slow_iter = iter(fast), iter(slow)
        >>> [next(fast_iter), next(fast_iter), next(slow_iter)]  # first chunks are reserved: 0-1 and 2-3
        [0, 1, 2]
        >>> list(fast_iter), list(slow_iter)  # the fast worker claims the rest; every index once
        ([4], [3])
        >>> counter.clear()
        >>> server = ClaimSampler(
        ...     5, 2, claim, epoch=lambda: 0, asynchronous=lambda: True, rank=0, world_size=2, reserved_only=lambda: True
        ... )
        >>> list(server), list(slow)  # a dedicated server rank: its reserved chunk only; the other rank the rest
        ([0, 1], [2, 3, 4])
    """

    def __init__(
        self,
        num_samples: int,
        chunk_size: int,
        claim: ClaimFn,
        epoch: Callable[[], int],
        asynchronous: Callable[[], bool],
        rank: int,
        world_size: int,
        shuffle: bool = False,
        seed: int = 0,
        tail: TailFn | None = None,
        reserved_only: Callable[[], bool] = lambda: False,
        pool_chunks: int | None = None,
    ) -> None:
        check_range("chunk_size", chunk_size, low=1, integer=True)
        self.num_samples = num_samples
        #: the positions of the epoch's order that are trained (all, unless ``pool_chunks`` limits them)
        self.epoch_samples = num_samples if pool_chunks is None else min(num_samples, pool_chunks * chunk_size)
        self.chunk_size = chunk_size
        self.claim = claim
        self.epoch = epoch
        self.asynchronous = asynchronous
        self.rank = rank
        self.world_size = world_size
        self.shuffle = shuffle
        self.seed = seed
        self.tail = tail
        self.reserved_only = reserved_only
        #: asynchronous mode: the chunks (``position // chunk_size``) whose indices were yielded and whose batch has not
        #: been taken with :meth:`next_chunk` yet, oldest first
        self.pending_chunks: deque[int] = deque()
        #: asynchronous mode: chunks reserved per claim, to save round trips to the shared counter (local SGD sets it
        #: from a rank's expected steps per round); a claim never takes more than half of this rank's share
        #: (:attr:`claim_share`) of the chunks it last saw left, so near the epoch's end the ranks run dry within about a
        #: chunk of each other (:func:`tail_claim`)
        self.claim_chunks = 1
        #: asynchronous mode: this rank's share of the ranks' summed throughput, which sizes its claims near the epoch's
        #: end (local SGD sets it from the speeds exchanged at round ends); ``None``: ``1 / world_size``
        self.claim_share: float | None = None
        #: asynchronous mode: the fastest rank's share of the ranks' summed throughput; with :attr:`claim_share` set, a
        #: slower rank stops claiming near the epoch's end once another chunk would keep the others waiting
        #: (:func:`stops_claiming`); ``None``: every rank claims until the pool is empty
        self.lead_share: float | None = None
        #: asynchronous mode: the shared counter's position as this rank last saw it (its claims' end)
        self.pool_position = 0
        #: asynchronous mode: the end (a position) of the segment this rank claims from (the epoch's end without
        #: validation points)
        self.segment_end = self.epoch_samples
        #: asynchronous mode: the chunk of the batch last taken with :meth:`next_chunk` (-1: none)
        self.current_chunk = -1
        #: ``segments(epoch) -> starts``: where the epoch's segments after the first start (chunk numbers), one per
        #: validation point inside the epoch (:mod:`~lightning_hetero.async_ps.runtime.validation_points`); none by default
        self.segments: Callable[[int], list[int]] = lambda epoch: []
        self._starts = [0]
        self._closed_epoch = -1  # the epoch whose pool this rank closed (see :meth:`close`)
        self._iterating = (-1, False)  # the epoch of the iteration in progress, and whether its chunks are claimed
        self._resume: tuple[int, int] | None = None  # see :meth:`resume_from`

    @property
    def samples_left(self) -> int:
        """Asynchronous mode: samples of the epoch (of its segment, with validation points) nobody had claimed when
        this rank last claimed (an upper bound)."""
        return max(0, self.segment_end - self.pool_position)

    def next_chunk(self) -> int:
        """The chunk of the oldest batch yielded but not yet taken (the batch about to be trained); -1 if none."""
        self.current_chunk = self.pending_chunks.popleft() if self.pending_chunks else -1
        return self.current_chunk

    def __iter__(self) -> Iterator[int]:
        epoch = self.epoch()
        order = epoch_order(self.num_samples, epoch, self.shuffle, self.seed)
        self._iterating = (epoch, self.asynchronous())
        if not self._iterating[1]:
            self._starts = [0]
            for start, stop in round_robin_chunks(self.epoch_samples, self.chunk_size, self.rank, self.world_size):
                yield from order[start:stop]
            return
        # Each rank's first chunk of a segment is reserved (chunk number ``rank`` of it), so every rank trains at
        # least one batch per segment and epoch-level collectives (``self.log(..., on_epoch=True, sync_dist=True)``)
        # and validation points stay matched.
        self.pending_chunks = deque()
        self.current_chunk = -1
        own: set[int] = set()
        claims = not self.reserved_only()
        chunks = -(-self.epoch_samples // self.chunk_size)
        self._starts = [0, *self.segments(epoch)]
        for segment in range(self._resumed_segment(epoch), len(self._starts)):
            first = self._starts[segment]
            end = self._starts[segment + 1] if segment + 1 < len(self._starts) else chunks
            self.segment_end = min(end * self.chunk_size, self.epoch_samples)
            pool = (first + self.world_size) * self.chunk_size  # the segment's claims' first position
            start, stop = (first + self.rank) * self.chunk_size, (first + self.rank + 1) * self.chunk_size
            self.pool_position = pool
            reserved = True
            while start < self.segment_end:
                for position in range(start, min(stop, self.segment_end), self.chunk_size):
                    if not reserved and self._closed_epoch == epoch:  # a stop: the claim's other batches are left
                        break
                    yield from self._chunk(order, position // self.chunk_size, own)
                if not claims or self._closed_epoch == epoch or self._stops(epoch, segment, pool):
                    break
                reserved = False
                count = tail_claim(
                    self.claim_chunks, self.samples_left, self.chunk_size, self.world_size, self.claim_share
                )
                start = pool + self._claim(epoch, segment, count * self.chunk_size)
                stop = self.pool_position = start + count * self.chunk_size
        if self.tail is not None:
            for chunk in self.tail(epoch, own):
                yield from self._chunk(order, chunk, own)

    def position(self) -> dict[str, int] | None:
        """Asynchronous mode, at a validation point inside an epoch (the batch last taken ends this rank's part of a
        segment, so every chunk before the next segment was claimed): ``{"epoch": epoch, "sample": position}``, the
        position in the epoch's order where the next segment starts; ``None`` elsewhere. Every rank reports the same
        position at a validation point, where all ranks meet."""
        epoch, asynchronous = self._iterating
        if not asynchronous or not self.segment_ended():
            return None
        start = self._starts[bisect_right(self._starts, self.current_chunk)]
        return {"epoch": epoch, "sample": start * self.chunk_size}

    def resume_from(self, position: Mapping[str, int] | None) -> None:
        """Make the next asynchronous iteration of ``position["epoch"]`` start at the segment that starts at
        ``position["sample"]`` (a :meth:`position` saved in a checkpoint), leaving out the chunks before it; ``None``:
        start at the epoch's beginning. A position where no segment starts this time (another world size, batch size
        or ``val_check_interval``) is ignored with a warning: the epoch then starts again."""
        self._resume = None if position is None else (int(position["epoch"]), int(position["sample"]))

    def _resumed_segment(self, epoch: int) -> int:
        """The segment this iteration of ``epoch`` starts at (see :meth:`resume_from`; once)."""
        resume, self._resume = self._resume, None
        if resume is None or resume[0] != epoch:
            return 0
        chunk, offset = divmod(resume[1], self.chunk_size)
        if offset == 0 and chunk in self._starts:
            return self._starts.index(chunk)
        rank_zero_warn(
            f"lightning-hetero: the checkpoint's position in epoch {epoch} (sample {resume[1]} of its order) is not a "
            "validation point of this run (another world size, batch size or val_check_interval): the epoch starts "
            "again"
        )
        return 0

    def _stops(self, epoch: int, segment: int, pool: int) -> bool:
        """Whether this rank stops claiming from ``segment`` (see :func:`stops_claiming`); near the decision it first
        reads the counter's position (a claim of none), as its own view is as old as its last claim."""
        share, lead = self.claim_share, self.lead_share
        if share is None or lead is None or share >= lead:
            return False
        held, chunk, world = len(self.pending_chunks), self.chunk_size, self.world_size
        if stops_claiming(held, self.samples_left, chunk, world, share, lead):
            return True
        others = self.samples_left - 2 * chunk * (1 / share - 1)  # what the others claim while it trains 2 chunks
        if not stops_claiming(held, max(0, round(others)), chunk, world, share, lead):
            return False  # far from the decision: no need to read the counter
        self.pool_position = pool + self._claim(epoch, segment, 0)
        return stops_claiming(held, self.samples_left, chunk, world, share, lead)

    def _claim(self, epoch: int, segment: int, count: int) -> int:
        """``count`` positions of ``segment``'s claims (segment 0 is the epoch's whole pool without validation
        points)."""
        return self.claim(epoch, count) if segment == 0 else self.claim(epoch, count, segment)

    def close(self, epoch: int) -> None:
        """Claim what is left of ``epoch``'s pool (every segment's), so every rank runs dry within a batch or two of
        each segment it still enters (each still trains its reserved first batch there); this rank also leaves the
        batches it claimed and has not yielded yet."""
        self._closed_epoch = epoch
        for segment in range(len(self._starts)):
            self._claim(epoch, segment, self.num_samples)

    def segment_ended(self) -> bool:
        """Asynchronous mode: whether the batch last taken with :meth:`next_chunk` is this rank's last of its segment
        (the next batch the loader holds lies in a later one): a validation point."""
        if not self.pending_chunks or self.current_chunk < 0:
            return False
        return bisect_right(self._starts, self.pending_chunks[0]) > bisect_right(self._starts, self.current_chunk)

    def _chunk(self, order: list[int], chunk: int, own: set[int]) -> Iterator[int]:
        own.add(chunk)
        self.pending_chunks.append(chunk)
        yield from order[chunk * self.chunk_size : min((chunk + 1) * self.chunk_size, self.epoch_samples)]
