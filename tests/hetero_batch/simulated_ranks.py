"""A deterministic stand-in for N synchronous ranks, for closed-loop tests of the controller without processes.

Rank ``k`` needs ``overhead_s[k] + per_sample_s[k] x b`` seconds of CPU for a step of ``b`` samples, optionally under
a CFS quota (:class:`~lightning_hetero.emulation.slowdown.CfsQuota`, charged every millisecond of CPU on a virtual
clock) and multiplied by seeded noise (``noise``, or one per rank: ``noises``). A step ends when the slowest rank is
done plus ``comm_s``; each rank's busy time is its own compute including its throttling, as
:class:`~lightning_hetero.measurement.BusyTimer` measures it, with its CPU time at the quota's rate as a floor
(:func:`~lightning_hetero.measurement.sustained_step_s`), or no floor with ``quota_visible=False`` (a quota the rank
cannot read: neither a cgroup it finds nor an emulator among the callbacks): a rank under a quota runs at full speed
until the quota period's budget is spent and stops to the period's end, so its per-step times are bimodal, and
without the floor nothing evens them out.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Sequence
from itertools import pairwise

import torch

from lightning_hetero.emulation.slowdown import CfsQuota
from lightning_hetero.hetero_batch.controller import BatchSizeController
from lightning_hetero.hetero_batch.cost_model import PeriodCostModel
from lightning_hetero.hetero_batch.period import read_rows
from lightning_hetero.hetero_batch.policy import AdjustmentPolicy
from lightning_hetero.hetero_batch.settings import HeteroBatchSettings
from lightning_hetero.hetero_batch.tuner import SplitTuner


class SimulatedRanks:
    def __init__(
        self,
        overhead_s: Sequence[float],
        per_sample_s: Sequence[float],
        quotas: Sequence[float | None] | None = None,
        noise: float = 0.0,
        comm_s: float = 0.001,
        seed: int = 0,
        quota_visible: bool = True,
        noises: Sequence[float] | None = None,
    ) -> None:
        self.quota_visible = quota_visible
        self.overhead_s = list(overhead_s)
        self.per_sample_s = list(per_sample_s)
        self.quotas = [None if q is None else CfsQuota(q, 0.1) for q in (quotas or [None] * len(overhead_s))]
        self.noise = noise
        self.noises = None if noises is None else list(noises)
        self.comm_s = comm_s
        self.random = random.Random(seed)
        self.now = 0.0

    def step(self, split: Sequence[int]) -> tuple[list[tuple[float, float]], float]:
        """Run one synchronous step; return each rank's (busy, floor) seconds and the step's wall seconds."""
        start = self.now
        busy = []
        for k, b in enumerate(split):
            noise = self.noise if self.noises is None else self.noises[k]
            need = (self.overhead_s[k] + self.per_sample_s[k] * b) * (1 + noise * self.random.uniform(-1, 1))
            now = start
            quota = self.quotas[k]
            while need > 1e-12:
                chunk = min(need, 0.001)
                need -= chunk
                now += chunk
                if quota is not None:
                    now += quota.charge(chunk, now)
            # what HeteroBatchCallback measures: busy time, and as a floor the CPU time at the quota's rate
            cpu_s = self.overhead_s[k] + self.per_sample_s[k] * b
            busy.append((now - start, 0.0 if quota is None or not self.quota_visible else cpu_s / quota.quota_cpus))
        wall = max(b for b, _ in busy) + self.comm_s
        self.now = start + wall
        return busy, wall

    def mean_step_s(self, split: Sequence[int], steps: int) -> float:
        return sum(self.step(split)[1] for _ in range(steps)) / steps


def run_controller(
    ranks: SimulatedRanks,
    global_batch: int,
    periods: int,
    period_steps: int = 8,
    change_at: int | None = None,
    change: dict | None = None,
    **policy_options: object,
) -> dict:
    """Closed loop as in HeteroBatchCallback: per-rank PeriodCostModels fed each period's steps (the first step at a
    new split discarded; all restart from the newest period when one sees a change), one AdjustmentPolicy decision
    per period, applied from the next step; the synchronous step is measured over the steps at the split in force
    since it came into force, or this period's when a rank saw a change)."""
    world = len(ranks.overhead_s)
    policy = AdjustmentPolicy(BatchSizeController(global_batch, world), **policy_options)  # type: ignore[arg-type]
    models = [PeriodCostModel() for _ in range(world)]
    split = policy.controller.equal_split()
    splits, walls, decisions = [], [], []
    sync_walls: list[float] = []
    step = 0
    for _ in range(periods):
        period: list[list[tuple[int, float, float]]] = [[] for _ in range(world)]
        period_walls = []
        for index in range(period_steps):
            if change_at is not None and step == change_at and change:
                for name, values in change.items():
                    setattr(ranks, name, list(values))
            busy, wall = ranks.step(split)
            splits.append(split)
            walls.append(wall)
            step += 1
            if index == 0:
                continue  # the first step at a (possibly new) split is discarded, as the callback does
            period_walls.append(wall)
            for k in range(world):
                period[k].append((split[k], *busy[k]))
        changed = [models[k].update(period[k]).changed for k in range(world)]
        if any(changed):  # as the callback does: every rank restarts from the same period
            for k in range(world):
                if not changed[k]:
                    models[k].restart_from_latest()
        costs = [(m.overhead_s, m.per_sample_s) for m in models]
        sync_walls = period_walls if any(changed) else (sync_walls + period_walls)[-32:]
        kept = sorted(sync_walls)[: max(1, len(sync_walls) - 1)]  # without the longest step, as the callback does
        sizes_known = [len(m.sizes) for m in models]
        errors = [m.relative_error(b) for m, b in zip(models, split, strict=True)]
        decision = policy.decide(
            split, costs, sum(kept) / len(kept), sizes_known, sync_steps=len(kept), relative_errors=errors
        )
        decisions.append(decision)
        if decision.apply:
            split = decision.sizes
            sync_walls = []
    return {"splits": splits, "walls": walls, "decisions": decisions}


def best_static(
    ranks_factory, global_batch: int, steps: int = 64, rank1_sizes: Sequence[int] | None = None
) -> tuple[tuple[int, ...], float]:
    """Brute force over 2-rank splits (rank 1's sizes: all, or ``rank1_sizes``): the split with the shortest mean
    step (fresh ranks for each split)."""
    best = None
    for b0 in range(1, global_batch) if rank1_sizes is None else [global_batch - b for b in rank1_sizes]:
        split = (b0, global_batch - b0)
        mean = ranks_factory().mean_step_s(split, steps)
        if best is None or mean < best[1]:
            best = (split, mean)
    assert best is not None
    return best


def run_tuner(
    ranks: SimulatedRanks,
    global_batch: int,
    epochs: int = 3,
    steps_in_epoch: int = 32,
    adjust_every_n_steps: int | None = None,
    change_at: int | None = None,
    change: dict | None = None,
) -> dict:
    """Closed loop through the callback's entry points, one :class:`SplitTuner` per rank built from the settings
    (default warm-up): :meth:`~SplitTuner.start_fit`, every step recorded (the first at a new split and the one across
    an epoch's end not measured), and at each adjustment (:meth:`~SplitTuner.adjusts_after`, every epoch's end) the
    rows closed, read as after the all-gather and adjusted; a new split comes into force at the next step."""
    world = len(ranks.overhead_s)
    settings = HeteroBatchSettings(adjust_every_n_steps=adjust_every_n_steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuners = [SplitTuner.from_settings(settings, global_batch, rank, world, "cpu") for rank in range(world)]
    splits: list[tuple[int, ...]] = []
    walls: list[float] = []
    position, previous = 0, None
    for epoch in range(epochs):
        for tuner in tuners:
            if epoch == 0:
                tuner.start_fit(epoch, steps_in_epoch, lock_step=True)
        for index in range(steps_in_epoch):
            if change_at is not None and position == change_at and change:
                for name, values in change.items():
                    setattr(ranks, name, list(values))
            split = tuners[0].plan.split_at(position)
            busy, wall = ranks.step(split)
            for k, tuner in enumerate(tuners):
                if split != previous or index == 0:
                    tuner.skip_next()
                tuner.record_step(split, busy_s=busy[k][0], floor_s=busy[k][1], wall_s=wall)
            previous = split
            splits.append(split)
            walls.append(wall)
            position += 1
            asked = [tuner.adjusts_after(index + 1, steps_in_epoch, epoch) for tuner in tuners]
            assert all(a == asked[0] for a in asked)
            if index + 1 == steps_in_epoch or asked[0]:
                seen = read_rows(torch.stack([tuner.close_period(position - 1) for tuner in tuners]))
                decisions = [tuner.adjust(seen, step=position, epoch=epoch) for tuner in tuners]
                assert all(d == decisions[0] for d in decisions)
    return {"splits": splits, "walls": walls, "history": tuners[0].history, "tuners": tuners}


def changes(splits: Sequence[tuple[int, ...]]) -> int:
    """How many times the split in force changes."""
    return sum(1 for a, b in pairwise(splits) if a != b)


def best_fixed(ranks_factory, global_batch: int, steps: int = 96) -> tuple[tuple[int, ...], float]:
    """The fixed split with the shortest mean step, swept over 2 ranks' splits or, for more ranks, over moves of one
    sample at a time from the speed-proportional split (fresh ranks for each split)."""
    ranks = ranks_factory()
    world = len(ranks.overhead_s)
    if world == 2:
        return best_static(ranks_factory, global_batch, steps)
    cache: dict[tuple[int, ...], float] = {}

    def mean(split: tuple[int, ...]) -> float:
        if split not in cache:
            cache[split] = ranks_factory().mean_step_s(split, steps)
        return cache[split]

    shares = [1.0 if quota is None else quota.quota_cpus for quota in ranks.quotas]
    costs = zip(ranks.overhead_s, ranks.per_sample_s, shares, strict=True)
    rates = [share / (a + c * global_batch / world) for a, c, share in costs]
    split = list(BatchSizeController(global_batch, world).propose(rates))
    while True:
        best = tuple(split)
        for i in range(world):
            for j in range(world):
                if i != j and split[i] > 1:
                    moved = list(split)
                    moved[i] -= 1
                    moved[j] += 1
                    if mean(tuple(moved)) < mean(best):
                        best = tuple(moved)
        if best == tuple(split):
            return best, mean(best)
        split = list(best)
