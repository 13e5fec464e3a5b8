"""Each rank's batches: every global batch split across ranks by the current per-rank sizes, the user's loader
rebuilt around that split, and ``torch.compile`` told that their size changes.

Each epoch draws one seeded permutation of the dataset, identical on every rank, and cuts it into global batches;
rank ``k`` takes its slice of each global batch according to the split in force at that step. So every sample is
used exactly once per epoch across ranks, every rank does the same number of steps, and the split may change at
any step.

A :class:`SplitPlan` records which split is in force from which step on. Changes are only ever planned for
steps no rank's sampler has produced yet (DataLoader workers prefetch indices ahead of training), so all ranks
use the same split for the same step.

The new loader (:func:`build_hetero_loader`) keeps the user's dataset, ``collate_fn``, worker settings and
shuffling, and draws its batches from the sampler: ``sampler=HeteroBatchSampler(...)`` with ``batch_size=None`` over
a :class:`BatchIndexedDataset`, so batches are still collated in the worker processes.

A compiled model specialises on input shapes: each new batch size would compile again (and torch's global limit
stops recompiling after a few). HeteroBatch therefore marks the first dimension of each batch's tensors dynamic
(:func:`mark_batch_dynamic`, ``torch._dynamo.maybe_mark_dynamic``: a model that needs a static size keeps it), draws
sizes from multiples of ``batch_size_multiple`` (8 by default on CUDA), and :class:`RecompileWatch` warns, naming the
rank, when this process has compiled more graphs than a bound since the fit started.

Example::

    >>> import torch
    >>> batch = (torch.zeros(16, 3), torch.zeros(16, dtype=torch.long))
    >>> mark_batch_dynamic(batch, size=16)
    2
"""

from __future__ import annotations

import bisect
import logging
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

from lightning_hetero._deprecation import warn_renamed
from lightning_hetero.allocation import apportion
from lightning_hetero.epoch_order import epoch_order


class SplitPlan:
    """Per-rank batch sizes by global step position (``epoch * steps_per_epoch + step``); append-only.

    Example::

        >>> plan = SplitPlan([8, 8])
        >>> plan.change_at(5, [12, 4])
        >>> plan.split_at(4), plan.split_at(5), plan.current
        ((8, 8), (12, 4), (12, 4))
    """

    def __init__(self, initial: Sequence[int]) -> None:
        self._positions: list[int] = [0]
        self._splits: list[tuple[int, ...]] = [tuple(int(b) for b in initial)]

    @property
    def current(self) -> tuple[int, ...]:
        """The newest split (possibly scheduled for a step not reached yet)."""
        return self._splits[-1]

    def split_at(self, position: int) -> tuple[int, ...]:
        return self._splits[bisect.bisect_right(self._positions, position) - 1]

    def change_at(self, position: int, split: Sequence[int]) -> None:
        """Put ``split`` in force from step ``position`` on (not before the last change)."""
        split = tuple(int(b) for b in split)
        if len(split) != len(self.current) or sum(split) != sum(self.current):
            raise ValueError(
                f"a new split must keep {len(self.current)} ranks and the global batch {sum(self.current)}"
            )
        if position < self._positions[-1]:
            raise ValueError(
                f"cannot change the split at step {position}, before the last change ({self._positions[-1]})"
            )
        if position == self._positions[-1]:
            self._splits[-1] = split
        else:
            self._positions.append(position)
            self._splits.append(split)

    def schedule(self, position: int, split: Sequence[int]) -> None:
        """Deprecated old name of :meth:`change_at` (renamed in issue 13); removed in the next release."""
        warn_renamed("SplitPlan.schedule", "SplitPlan.change_at")
        self.change_at(position, split)


class HeteroBatchSampler(DistributedSampler):
    """Yields this rank's list of sample indices for each step of an epoch.

    It is a :class:`~torch.utils.data.DistributedSampler` (so Lightning neither replaces it nor forgets to call
    ``set_epoch`` on it), used as the DataLoader's ``sampler`` with ``batch_size=None`` over a
    :class:`BatchIndexedDataset`.

    Args:
        dataset: the map-style dataset (only its length is used).
        plan: the shared split plan; its splits have one size per rank and sum to the global batch.
        rank: this rank.
        shuffle: draw a fresh seeded permutation each epoch (``seed + epoch``), else use dataset order.
        seed: base seed, identical on every rank.
        drop_last: drop the final partial global batch instead of splitting it.
        min_size: the fewest samples a rank may get at a step (2 for a model with BatchNorm layers).

    The final partial global batch of ``r`` samples is split in proportion to the current split when every rank
    can get at least ``min_size`` samples; otherwise those samples join the previous global batch instead (so
    nothing is dropped unless ``drop_last``).

    Example::

        >>> plan = SplitPlan([3, 1])
        >>> ranks = [HeteroBatchSampler(list(range(10)), plan, rank=r, shuffle=False) for r in range(2)]
        >>> [list(sampler) for sampler in ranks]
        [[[0, 1, 2], [4, 5, 6], [8]], [[3], [7], [9]]]
    """

    def __init__(
        self,
        dataset: Dataset | Sequence[Any],
        plan: SplitPlan,
        rank: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        min_size: int = 1,
    ) -> None:
        world_size = len(plan.current)
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)  # type: ignore[arg-type]
        self.plan = plan
        self.dataset_size = len(dataset)  # type: ignore[arg-type]
        self.global_batch_size = sum(plan.current)
        if self.dataset_size < self.global_batch_size:
            raise ValueError(
                f"the dataset ({self.dataset_size} samples) is smaller than one global batch "
                f"({self.global_batch_size}): lower the batch size or use more data"
            )
        full, remainder = divmod(self.dataset_size, self.global_batch_size)
        self._remainder = 0 if drop_last else remainder
        self.min_size = min_size
        self.steps_per_epoch = full + (1 if self._remainder >= world_size * min_size else 0)
        self.produced_position = -1
        self._pending_sizes: deque[tuple[int, ...]] = deque()

    def __len__(self) -> int:
        return self.steps_per_epoch

    def position(self, epoch: int, step: int) -> int:
        return epoch * self.steps_per_epoch + step

    def sizes_at(self, epoch: int, step: int) -> tuple[int, ...]:
        """Every rank's batch size at ``step`` of ``epoch`` (the last step may differ from the plan's split)."""
        split = self.plan.split_at(self.position(epoch, step))
        if step < self.steps_per_epoch - 1 or self._remainder == 0:
            return split
        world = len(split)
        if self._remainder >= world * self.min_size:
            return tuple(apportion(split, self._remainder, [self.min_size] * world, list(split)))
        extra = apportion(split, self._remainder, [0] * world, [self._remainder] * world)
        return tuple(b + e for b, e in zip(split, extra, strict=True))

    def next_sizes(self) -> tuple[int, ...]:
        """Every rank's batch size for the oldest batch yielded and not yet claimed by the training loop.

        DataLoaders deliver batches in the order the sampler yields them (prefetching included), so this pairs each
        batch with its sizes even when Lightning's ``batch_idx`` does not match the sampler's step (a mid-epoch
        resume replays the epoch from its start while ``batch_idx`` continues).
        """
        return self._pending_sizes.popleft()

    def __iter__(self) -> Iterator[list[int]]:
        self._pending_sizes.clear()  # batches of an abandoned iterator never reach the training loop
        epoch = self.epoch
        order = epoch_order(self.dataset_size, epoch, self.shuffle, self.seed)
        start = 0
        for step in range(self.steps_per_epoch):
            sizes = self.sizes_at(epoch, step)
            offset = start + sum(sizes[: self.rank])
            self.produced_position = max(self.produced_position, self.position(epoch, step))
            self._pending_sizes.append(sizes)
            yield order[offset : offset + sizes[self.rank]]
            start += sum(sizes)


class BatchIndexedDataset(Dataset):
    """Wraps a map-style dataset so that indexing with a list of indices returns the collated batch.

    With ``batch_size=None`` a DataLoader passes each sampler item (here: a list of indices) straight to the
    dataset, in the worker processes when ``num_workers > 0``; this keeps the user's ``collate_fn``.

    Example::

        >>> import torch
        >>> ds = BatchIndexedDataset([torch.tensor(i) for i in range(5)], collate_fn=torch.stack)
        >>> ds[[1, 3]]
        tensor([1, 3])
    """

    def __init__(self, dataset: Dataset | Sequence[Any], collate_fn: Callable[[list[Any]], Any]) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, indices: list[int]) -> Any:
        return self.collate_fn([self.dataset[i] for i in indices])


def passthrough(batch: Any) -> Any:
    """The DataLoader's ``collate_fn`` when :class:`BatchIndexedDataset` has already collated the batch."""
    return batch


def starting_batch_size(dataloader: Any) -> int:
    """The per-rank batch size the user's loader was built with; errors for loaders this callback cannot split."""
    if not isinstance(dataloader, DataLoader):
        raise TypeError(
            "HeteroBatchCallback needs the train dataloader to be a single torch DataLoader, got "
            f"{type(dataloader).__name__}; combined or multiple train loaders are not supported"
        )
    if isinstance(dataloader.dataset, IterableDataset):
        raise TypeError(
            "HeteroBatchCallback cannot split an IterableDataset (it draws each global batch from a permutation of "
            "a map-style dataset); give the train DataLoader a map-style dataset with __len__ and __getitem__"
        )
    if dataloader.batch_size is None:
        raise ValueError(
            "HeteroBatchCallback reads the starting per-rank batch size from the train DataLoader's batch_size, "
            "which is None (a custom batch_sampler?); build the loader with batch_size=..."
        )
    if not isinstance(dataloader.sampler, RandomSampler | SequentialSampler | DistributedSampler):
        raise ValueError(
            f"HeteroBatchCallback replaces the train sampler and cannot preserve a custom "
            f"{type(dataloader.sampler).__name__}; use shuffle=True/False instead"
        )
    return int(dataloader.batch_size)


def build_hetero_loader(dataloader: DataLoader, plan: SplitPlan, rank: int, seed: int, min_size: int = 1) -> DataLoader:
    """A loader over ``dataloader``'s dataset yielding this rank's slice of each global batch under ``plan`` (at least
    ``min_size`` samples a step, see :class:`~lightning_hetero.hetero_batch.batches.HeteroBatchSampler`)."""
    shuffle = isinstance(dataloader.sampler, RandomSampler) or bool(getattr(dataloader.sampler, "shuffle", False))
    sampler = HeteroBatchSampler(
        dataloader.dataset,
        plan,
        rank=rank,
        shuffle=shuffle,
        seed=seed,
        drop_last=dataloader.drop_last,
        min_size=min_size,
    )
    worker_options: dict[str, Any] = {}
    if dataloader.num_workers > 0:
        worker_options = {
            "prefetch_factor": dataloader.prefetch_factor,
            "persistent_workers": dataloader.persistent_workers,
        }
    return DataLoader(
        BatchIndexedDataset(dataloader.dataset, dataloader.collate_fn),
        sampler=sampler,
        batch_size=None,
        collate_fn=passthrough,
        num_workers=dataloader.num_workers,
        pin_memory=dataloader.pin_memory,
        timeout=dataloader.timeout,
        worker_init_fn=dataloader.worker_init_fn,
        multiprocessing_context=dataloader.multiprocessing_context,
        generator=dataloader.generator,
        **worker_options,
    )


log = logging.getLogger("lightning_hetero.hetero_batch")

#: compiled graphs per rank beyond which :class:`RecompileWatch` warns
RECOMPILE_BOUND = 8


def mark_batch_dynamic(batch: Any, size: int) -> int:
    """Mark dimension 0 of every tensor in ``batch`` whose first dimension is ``size`` as dynamic (sizes under 2
    are left: torch specialises them); returns how many tensors were marked."""
    if size < 2:
        return 0
    if isinstance(batch, torch.Tensor):
        if batch.dim() > 0 and batch.shape[0] == size:
            torch._dynamo.maybe_mark_dynamic(batch, 0)
            return 1
        return 0
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, tuple | list) else ()
    return sum(mark_batch_dynamic(item, size) for item in items)


def compiled_graphs() -> int:
    """Graphs ``torch.compile`` has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class RecompileWatch:
    """Warns once, naming the rank, when more than ``bound`` graphs were compiled since it was made.

    Args:
        rank: the rank named in the warning.
        bound: graphs allowed before the warning.

    Example::

        >>> watch = RecompileWatch(rank=1, bound=8)
        >>> watch.check(), watch.warned
        (0, False)
    """

    def __init__(self, rank: int, bound: int = RECOMPILE_BOUND) -> None:
        self.rank, self.bound = rank, bound
        self.start = compiled_graphs()
        self.warned = False

    def check(self) -> int:
        """Graphs compiled since the start; warns the first time they pass the bound."""
        compiled = compiled_graphs() - self.start
        if compiled > self.bound and not self.warned:
            self.warned = True
            log.warning(
                f"HeteroBatch: rank {self.rank} has compiled {compiled} graphs (more than {self.bound}): its batch "
                "sizes change faster than torch.compile's dynamic shapes absorb; set batch_size_multiple higher"
            )
        return compiled
