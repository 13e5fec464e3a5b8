"""Throughput-proportional per-rank batch sizes for synchronous training (OmniLearn's idea, inside Lightning).

Modules: ``callback`` (the Lightning glue), ``settings`` (the callback's read-only settings, its expert knobs in
:class:`HeteroBatchAdvanced`, and their checks), ``tuner`` (measured periods in, split decisions out), ``period``
(when to adjust, the steps measured, the one exchange), ``cost_model``, ``policy`` and ``controller`` (the
decision), ``timing`` (what a busy window leaves out), ``batches`` (global-batch slicing, the rebuilt loader),
``gradients`` (the batch-weighted gradient mean) and ``memory`` (``memory_caps="auto"``). The split arithmetic
itself is :mod:`lightning_hetero.allocation`.
"""

from lightning_hetero.allocation import apportion
from lightning_hetero.hetero_batch.batches import HeteroBatchSampler, SplitPlan
from lightning_hetero.hetero_batch.callback import HeteroBatchCallback
from lightning_hetero.hetero_batch.controller import BatchSizeController
from lightning_hetero.hetero_batch.settings import HeteroBatchAdvanced, HeteroBatchSettings

__all__ = [
    "BatchSizeController",
    "HeteroBatchAdvanced",
    "HeteroBatchCallback",
    "HeteroBatchSampler",
    "HeteroBatchSettings",
    "SplitPlan",
    "apportion",
]
