"""Throughput-proportional per-rank batch sizes for synchronous training (OmniLearn's idea, inside Lightning).

Modules: ``tuner`` (measured periods in, split decisions out: the cost model, ``policy`` and ``controller``),
``sampler`` (global-batch slicing, exactly-once coverage), ``aggregation`` (the batch-weighted gradient mean: a
weight on the loss gradient), ``lr_scaling``, ``loader`` (rebuilding the train loader) and ``callback`` (the
Lightning glue). The split arithmetic itself is :mod:`lightning_hetero.allocation`.
"""

from lightning_hetero.allocation import apportion
from lightning_hetero.hetero_batch.batches import HeteroBatchSampler, SplitPlan
from lightning_hetero.hetero_batch.callback import HeteroBatchCallback
from lightning_hetero.hetero_batch.controller import BatchSizeController

__all__ = ["BatchSizeController", "HeteroBatchCallback", "HeteroBatchSampler", "SplitPlan", "apportion"]
