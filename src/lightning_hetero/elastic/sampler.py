"""The training loaders of the elastic workers: :class:`ElasticBatchSampler` (local SGD) yields batches of the chunks
the ledger assigned to this worker, in the epoch's order; :class:`StepSampler` (synchronous) one placeholder per step.

Local SGD: Lightning's loop fetches one batch ahead, so the loader asks for a batch while the previous one, the last of a
round, has not ended the round yet. A worker is therefore always assigned one chunk more than its round's quota;
when it has none (the epoch's tail, while the last chunks are trained elsewhere), the loader yields an *idle* batch:
the strategy runs its forward and backward (Lightning requires the closure to run) without an optimizer step and
uses it only to attend the next round end. The epoch ends for every worker at the round that completes the ledger.

Example::

    >>> from lightning_hetero.local_sgd.outer_optimizer import OuterOptimizer
    >>> rounds = ElasticRounds(num_chunks=3, steps_per_round=1, outer=OuterOptimizer())
    >>> rounds.queue.extend([2, 0])
    >>> sampler = ElasticBatchSampler(rounds, num_samples=5, batch_size=2, shuffle=False, seed=0)
    >>> batches = iter(sampler)
    >>> next(batches), next(batches), next(batches)  # chunk 2 is the epoch's short last batch; then idle
    ([4], [0, 1], [0, 1])
    >>> [sampler.next_chunk() for _ in range(3)]
    [2, 0, -1]
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from torch.utils.data import DataLoader, Sampler

from lightning_hetero.elastic.rounds import ElasticRounds
from lightning_hetero.elastic.sync_steps import SyncSteps
from lightning_hetero.epoch_order import epoch_order, sampler_order

#: what :meth:`ElasticBatchSampler.next_chunk` returns for an idle batch
IDLE = -1


class ElasticBatchSampler(Sampler[list[int]]):
    """Yields the batches of the chunks assigned to this worker (see the module's docstring).

    Args:
        rounds: this worker's rounds (its queue of assigned chunks and the ledger's epoch).
        num_samples: the training set's length.
        batch_size: samples per chunk (the loader's batch size, the same on every worker).
        shuffle: a new order each epoch (the same on every worker).
        seed: the order's seed.
        join: called before an epoch's first batch (the worker joins the job there if it has not yet).
    """

    def __init__(
        self,
        rounds: ElasticRounds,
        num_samples: int,
        batch_size: int,
        shuffle: bool,
        seed: int,
        join: Callable[[], None] = lambda: None,
    ) -> None:
        self.rounds = rounds
        self.join = join
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        #: the chunk of each batch yielded and not trained yet (:data:`IDLE` for an idle batch), oldest first
        self.pending: deque[int] = deque()
        #: the ledger's epoch the current iteration yields batches of
        self.epoch = rounds.ledger.epoch

    def next_chunk(self) -> int:
        """The chunk of the batch about to be trained (:data:`IDLE`: an idle batch)."""
        return self.pending.popleft() if self.pending else IDLE

    def chunk_samples(self, chunk: int) -> int:
        return max(0, min(self.batch_size, self.num_samples - chunk * self.batch_size))

    def __iter__(self) -> Iterator[list[int]]:
        self.join()
        epoch = self.epoch = self.rounds.ledger.epoch
        order = epoch_order(self.num_samples, epoch, self.shuffle, self.seed)
        # a new iteration (an epoch's start; or Lightning restarting one): nothing fetched before is trained
        self.rounds.untake()
        self.pending.clear()
        while self.rounds.ledger.epoch == epoch:
            chunk = self.rounds.take()
            self.pending.append(IDLE if chunk is None else chunk)
            start = (chunk or 0) * self.batch_size
            yield order[start : start + self.batch_size]


def elastic_loader(
    dataloader: DataLoader, rounds: ElasticRounds, join: Callable[[], None] = lambda: None
) -> tuple[DataLoader, ElasticBatchSampler] | None:
    """The training ``dataloader`` rebuilt around an :class:`ElasticBatchSampler` (its dataset, workers and collate
    function kept; ``join`` see there), and the sampler; ``None`` when the loader has no batch size or a custom
    sampler."""
    order = sampler_order(dataloader.sampler)
    if dataloader.batch_size is None or order is None:
        return None
    shuffle, seed = order
    sampler = ElasticBatchSampler(rounds, len(dataloader.dataset), dataloader.batch_size, shuffle, seed, join)  # type: ignore[arg-type]
    loader = DataLoader(
        dataloader.dataset,
        batch_sampler=sampler,
        num_workers=dataloader.num_workers,
        collate_fn=dataloader.collate_fn,
        pin_memory=dataloader.pin_memory,
        worker_init_fn=dataloader.worker_init_fn,
    )
    return loader, sampler


class StepSampler(Sampler[list[int]]):
    """The training loader's batches: one placeholder per step of the epoch, of the global batch's length (what
    Lightning logs per step). The samples of a step are known only after its quorum, so the strategy fetches them
    itself; Lightning's loop fetches one batch ahead, so a placeholder is yielded only while the committed steps
    plus those yielded and not run yet leave a chunk of the epoch.

    Args:
        steps: this worker's steps (the ledger's epoch and committed steps).
        join: called before an epoch's first batch (the worker joins the job there if it has not yet).
    """

    def __init__(self, steps: SyncSteps, join: Callable[[], None]) -> None:
        self.steps = steps
        self.join = join
        #: placeholders yielded and not run yet
        self.pending = 0

    def __iter__(self) -> Iterator[list[int]]:
        self.join()
        steps = self.steps
        epoch = steps.ledger.epoch
        self.pending = 0
        while steps.ledger.epoch == epoch and steps.steps_done + self.pending < steps.ledger.num_chunks:
            self.pending += 1
            yield list(range(steps.chunk_samples(steps.steps_done + self.pending - 1)))

    def consume(self) -> None:
        self.pending = max(0, self.pending - 1)
