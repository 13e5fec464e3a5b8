"""The order in which an epoch visits the dataset, identical on every rank: the one permutation both samplers cut up
(:class:`~lightning_hetero.hetero_batch.HeteroBatchSampler` into global batches,
:class:`~lightning_hetero.async_ps.runtime.sampler.ClaimSampler` into claimed chunks)."""

from __future__ import annotations

import torch


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
