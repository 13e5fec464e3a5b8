"""Ranks that share one GPU are found from their device ids and warned about; nothing is gathered off CUDA."""

from types import SimpleNamespace

import torch

from lightning_hetero.hetero_batch.shared_device import shared_device_warning, shared_devices, warn_shared_devices
from lightning_hetero.measurement import BusyTimer


def test_ranks_with_the_same_host_and_gpu_are_grouped_and_named_in_the_warning():
    ids = ["a/GPU-1", "b/GPU-1", "a/GPU-1", "a/GPU-2", "b/GPU-1", "a/GPU-1"]
    assert shared_devices(ids) == [[0, 2, 5], [1, 4]]
    warning = shared_device_warning(ids)
    assert warning is not None and "ranks 0, 2, 5; ranks 1, 4 share one GPU" in warning


def test_distinct_gpus_and_non_cuda_ranks_give_no_warning():
    assert shared_device_warning(["a/GPU-1", "a/GPU-2", "b/GPU-1"]) is None
    assert shared_device_warning(["", "", ""]) is None


def test_off_cuda_nothing_is_gathered():
    def refuse(tensor):
        raise AssertionError("gathered off CUDA")

    strategy = SimpleNamespace(world_size=4, global_rank=0, all_gather=refuse)
    assert warn_shared_devices(strategy, torch.device("cpu"), BusyTimer()) is None
