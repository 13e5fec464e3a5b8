"""What a busy window leaves out: waits and the CPU quota; ranks that share one GPU are found and warned about,
and nothing is gathered off CUDA."""

from types import SimpleNamespace

import torch

from lightning_hetero.emulation.slowdown import SlowdownEmulator
from lightning_hetero.hetero_batch.timing import (
    COLLECTIVES,
    ComputeEndMarks,
    WaitExclusion,
    quota_source,
    shared_device_warning,
    shared_devices,
    warn_shared_devices,
)
from lightning_hetero.measurement import BusyTimer, ComputeTimer


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_strategy_collectives_count_as_waits_and_are_restored():
    clock = FakeClock()
    busy = BusyTimer(clock=clock, cpu_clock=clock)

    class Strategy:
        def barrier(self, name=None):
            clock.now += 0.5

        def reduce(self, tensor):
            clock.now += 0.25
            return tensor

    strategy = Strategy()
    exclusion = WaitExclusion(busy)
    exclusion.exclude_strategy_collectives(strategy)
    assert set(vars(strategy)) == {"barrier", "reduce"} and set(vars(strategy)) <= set(COLLECTIVES)
    busy.step_start()
    clock.now += 0.1  # own compute
    strategy.barrier()
    strategy.reduce(1)
    assert abs(busy.step_start() - 0.1) < 1e-9  # the 0.75 s in collectives is not this rank's busy time
    exclusion.remove(strategy)
    assert vars(strategy) == {}


def test_buffer_broadcast_between_the_two_forward_pre_hooks_is_a_wait():
    clock = FakeClock()
    busy = BusyTimer(clock=clock, cpu_clock=clock)

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.module = torch.nn.Linear(2, 2)

        def forward(self, x):
            clock.now += 0.3  # DDP's buffer broadcast, waiting for rank 0
            return self.module(x)

    outer = Outer()
    exclusion = WaitExclusion(busy)
    exclusion.exclude_buffer_broadcast(outer)
    busy.step_start()
    outer(torch.zeros(1, 2))
    clock.now += 0.2
    assert abs(busy.step_start() - 0.2) < 1e-9
    exclusion.remove(object())
    busy.step_start()
    outer(torch.zeros(1, 2))
    assert abs(busy.step_start() - 0.3) < 1e-9  # hooks removed: the broadcast counts again


def test_compute_end_marks_close_the_compute_window_and_start_the_wait():
    clock = FakeClock()
    timer, busy = ComputeTimer(clock=clock), BusyTimer(clock=clock, cpu_clock=clock)
    busy.step_start()
    timer.start()
    clock.now += 0.1
    ComputeEndMarks(timer, busy).mark_compute_end()
    clock.now += 0.4  # the all-reduce
    busy.close_ready()
    assert timer.elapsed_s() == 0.1 and abs(busy.step_start() - 0.1) < 1e-9


def test_the_quota_comes_from_a_cfs_emulator_else_the_cgroup(monkeypatch):
    monkeypatch.setattr("lightning_hetero.hetero_batch.timing.cgroup_cpu_quota", lambda: 0.5)
    assert quota_source([SlowdownEmulator({1: 4.0})], BusyTimer())() == 0.5  # a sleep emulator has no quota
    emulator = SlowdownEmulator({0: 4.0}, throttle="cfs")
    assert quota_source([emulator], BusyTimer())() is emulator.cpu_quota


def test_without_a_quota_no_cpu_clock_is_read(monkeypatch):
    monkeypatch.setattr("lightning_hetero.hetero_batch.timing.cgroup_cpu_quota", lambda: None)
    busy = BusyTimer()
    assert quota_source([SlowdownEmulator({1: 4.0})], busy)() is None and busy.cpu_clock is None
    monkeypatch.setattr("lightning_hetero.hetero_batch.timing.cgroup_cpu_quota", lambda: 0.5)
    busy = BusyTimer()
    assert quota_source([], busy)() == 0.5 and busy.cpu_clock is not None


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
