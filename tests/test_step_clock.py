"""Timing that sees the device: a fake device queue whose work completes after the host's calls return."""

import itertools

import pytest
import torch

from lightning_hetero import HeteroBatchCallback
from lightning_hetero.hetero_batch import HeteroBatchAdvanced
from lightning_hetero.hetero_batch.timing import ComputeEndMarks, PendingSteps
from lightning_hetero.measurement import BusyTimer, ComputeTimer
from lightning_hetero.step_clock import CudaEventClock, FakeDevice, HostClock, step_clock_for
from lightning_hetero.synthetic import MLPClassifier, SyntheticClassificationDataModule
from tests.helpers import single_device_trainer


class Ticks:
    """A host clock that advances one microsecond per read: every host call returns at once."""

    def __init__(self) -> None:
        self.counter = itertools.count()

    def __call__(self) -> float:
        return next(self.counter) * 1e-6


def ddp_steps(work_s, steps, clock_of):
    """Ranks in lock-step as under DDP on CUDA: each queues its forward and backward (``work_s[k]`` per step), marks
    its gradients ready, then its compute stream waits for the all-reduce, which ends when the slowest rank got there.
    Returns each rank's measured busy seconds per step as read by ``PendingSteps`` at the end."""
    host = Ticks()
    devices = [FakeDevice(host) for _ in work_s]
    timers = [BusyTimer(clock=clock_of(device, host), cpu_clock=None) for device in devices]
    pending = [PendingSteps() for _ in work_s]
    for _ in range(steps):
        for busy, queue in zip(timers, pending, strict=True):
            span = busy.close_step()
            if span is not None:
                queue.add((8, 8), span, floor_s=0.0)
        for device, busy, work in zip(devices, timers, work_s, strict=True):
            device.launch(work)
            ComputeEndMarks(ComputeTimer(clock=host), busy).mark_compute_end()
        reduced_at = max(device.free_at for device in devices) + 0.001  # the all-reduce needs every rank
        for device, busy in zip(devices, timers, strict=True):
            device.wait_until(reduced_at)
            busy.close_ready()
    measured = []
    for queue in pending:
        seen = []

        class Tuner:
            def record_step(self, split, busy_s, floor_s, wall_s, seen=seen):
                seen.append((busy_s, wall_s))

            def skip_next(self):
                pass

        queue.feed(Tuner(), wait=True)
        measured.append(seen)
    return measured


def test_a_rank_with_three_times_the_device_work_is_measured_three_times_slower():
    device_timed = ddp_steps([0.010, 0.030], steps=6, clock_of=lambda device, host: device)
    fast, slow = ([busy for busy, _ in rank] for rank in device_timed)
    assert len(fast) == len(slow) == 5
    ratio = (sum(slow) / len(slow)) / (sum(fast) / len(fast))
    assert ratio == pytest.approx(3.0, rel=1e-3)
    assert all(wall == pytest.approx(0.031, abs=1e-4) for _, wall in device_timed[0])  # the synchronous step
    # the host's clock sees none of it: the launches returned at once, and both ranks look alike
    host_timed = ddp_steps([0.010, 0.030], steps=6, clock_of=lambda device, host: HostClock(host))
    host_fast, host_slow = ([busy for busy, _ in rank] for rank in host_timed)
    assert max(host_fast + host_slow) < 1e-4


def test_steps_are_read_only_once_the_device_got_there():
    host = [0.0]
    device = FakeDevice(lambda: host[0])
    busy, pending, fed = BusyTimer(clock=device, cpu_clock=None), PendingSteps(), []

    class Tuner:
        def record_step(self, split, busy_s, floor_s, wall_s):
            fed.append(busy_s)

    busy.close_step()
    for _ in range(3):
        device.launch(0.1)
        pending.add((4,), busy.close_step(), 0.0)
    host[0] = 0.15  # the device finished the first step only
    pending.feed(Tuner())
    assert fed == [pytest.approx(0.1)]
    pending.feed(Tuner(), wait=True)
    assert fed == [pytest.approx(0.1)] * 3


def test_the_callback_measures_the_device_work_not_the_host_calls():
    """A one-process fit whose module queues device work of 1 ms per sample on a fake device: the tuner's busy time
    is the device's, though the host's clock hardly moves."""
    host = Ticks()
    device = FakeDevice(host)

    class Queued(MLPClassifier):
        def training_step(self, batch, batch_idx):
            device.launch(0.001 * len(batch[0]))
            return super().training_step(batch, batch_idx)

    callback = HeteroBatchCallback(verbose=False, advanced=HeteroBatchAdvanced(warmup_steps=1))
    callback.busy = BusyTimer(clock=device, cpu_clock=None)
    callback.exclusion.busy = callback.busy
    trainer = single_device_trainer(callback)
    trainer.fit(Queued(), datamodule=SyntheticClassificationDataModule(num_samples=256, batch_size=32))
    assert callback.busy.step_clock is device  # an injected device clock is kept
    assert callback.tuner.busy_s[0] == pytest.approx(0.032, rel=1e-3)


def test_the_clock_follows_the_device():
    assert isinstance(step_clock_for(torch.device("cpu")), HostClock)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_events_see_device_work_the_host_does_not_wait_for():
    clock = CudaEventClock(torch.device("cuda"))
    cycles = 50_000_000
    host = HostClock()
    torch.cuda._sleep(1)  # the kernel's first launch may load it (CUDA's lazy loading): a host cost, not measured here
    torch.cuda.synchronize()
    start, host_start = clock.stamp(), host.stamp()
    torch.cuda._sleep(cycles)
    end, host_end = clock.stamp(), host.stamp()
    device_s = clock.seconds(start, end)
    assert device_s > 5 * host.seconds(host_start, host_end)
    assert isinstance(step_clock_for(torch.device("cuda")), CudaEventClock)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_sleep_queues_about_the_asked_device_time():
    clock = CudaEventClock(torch.device("cuda"))
    clock.sleep(0.001)  # calibrates
    start = clock.stamp()
    clock.sleep(0.050)
    assert 0.025 < clock.seconds(start, clock.stamp()) < 0.1
