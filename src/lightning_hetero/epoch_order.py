"""The order in which an epoch visits the dataset, identical on every rank: the one permutation both samplers cut up
(:class:`~lightning_hetero.hetero_batch.HeteroBatchSampler` into global batches,
:class:`~lightning_hetero.async_ps.runtime.sampler.ClaimSampler` into claimed chunks, the elastic strategies' samplers
into rounds and steps), and the order of a user's sampler they replace (:func:`sampler_order`)."""

from __future__ import annotations

import os

import torch
from torch.utils.data import DistributedSampler, RandomSampler, Sampler, SequentialSampler


def epoch_order(num_samples: int, epoch: int, shuffle: bool, seed: int) -> list[int]:
    """The epoch's visiting order, identical on every rank: a permutation seeded with ``seed + epoch``.

    Args:
        num_samples: dataset length.
        epoch: the epoch number (shuffles differently each epoch).
        shuffle: permute, or keep ``0..num_samples-1``.
        seed: base seed shared by all ranks.

    Example::

        >>> epoch_order(4, epoch=0, shuffle=False, seed=0)
        [0, 1, 2, 3]
        >>> sorted(epoch_order(4, epoch=3, shuffle=True, seed=0))
        [0, 1, 2, 3]
        >>> epoch_order(8, epoch=1, shuffle=True, seed=0) == epoch_order(8, epoch=0, shuffle=True, seed=1)
        True
    """
    if not shuffle:
        return list(range(num_samples))
    generator = torch.Generator().manual_seed(seed + epoch)
    return torch.randperm(num_samples, generator=generator).tolist()


def sampler_order(sampler: Sampler | object) -> tuple[bool, int] | None:
    """``(shuffle, seed)`` of a sampler the package's samplers may replace: Lightning's ``DistributedSampler`` (its
    seed), a plain random sampler (its generator's seed, else Lightning's global seed from ``seed_everything``, as
    Lightning seeds the ``DistributedSampler`` it injects) or a sequential one; ``None`` for a custom sampler, which
    decides itself which rank sees what.

    Example::

        >>> from torch.utils.data import DataLoader
        >>> sampler_order(DataLoader(range(10), shuffle=True, generator=torch.Generator().manual_seed(7)).sampler)
        (True, 7)
        >>> sampler_order(DataLoader(range(10), sampler=[3, 1]).sampler) is None
        True
    """
    if isinstance(sampler, DistributedSampler):
        return sampler.shuffle, sampler.seed
    if isinstance(sampler, RandomSampler):
        generator = sampler.generator
        return True, generator.initial_seed() if generator is not None else int(os.getenv("PL_GLOBAL_SEED", "0"))
    if isinstance(sampler, SequentialSampler):
        return False, 0
    return None
