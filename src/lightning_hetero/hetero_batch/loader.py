"""Rebuilding the user's train DataLoader around a :class:`HeteroBatchSampler`.

The new loader keeps the user's dataset, ``collate_fn``, worker settings and shuffling, and draws its batches
from the sampler: ``sampler=HeteroBatchSampler(...)`` with ``batch_size=None`` over a
:class:`BatchIndexedDataset`, so batches are still collated in the worker processes.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

from lightning_hetero.hetero_batch.sampler import BatchIndexedDataset, HeteroBatchSampler, SplitPlan, passthrough


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
    ``min_size`` samples a step, see :class:`~lightning_hetero.hetero_batch.sampler.HeteroBatchSampler`)."""
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
