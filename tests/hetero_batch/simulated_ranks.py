"""A deterministic stand-in for N synchronous ranks, for closed-loop tests of the controller without processes.

Rank ``k`` needs ``overhead_s[k] + per_sample_s[k] x b`` seconds of CPU for a step of ``b`` samples, optionally under
a CFS quota (:class:`~lightning_hetero.emulation.slowdown.CfsQuota`, charged every millisecond of CPU on a virtual
clock) and multiplied by seeded noise. A step ends when the slowest rank is done plus ``comm_s``; each rank's busy
time is its own compute including its throttling, as :class:`~lightning_hetero.measurement.BusyTimer` measures it,
with its CPU time at the quota's rate as a floor (:func:`~lightning_hetero.measurement.sustained_step_s`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from lightning_hetero.emulation.slowdown import CfsQuota
from lightning_hetero.hetero_batch.controller import BatchSizeController
from lightning_hetero.hetero_batch.cost_model import PeriodCostModel
from lightning_hetero.hetero_batch.policy import AdjustmentPolicy


class SimulatedRanks:
    def __init__(
        self,
        overhead_s: Sequence[float],
        per_sample_s: Sequence[float],
        quotas: Sequence[float | None] | None = None,
        noise: float = 0.0,
        comm_s: float = 0.001,
        seed: int = 0,
    ) -> None:
        self.overhead_s = list(overhead_s)
        self.per_sample_s = list(per_sample_s)
        self.quotas = [None if q is None else CfsQuota(q, 0.1) for q in (quotas or [None] * len(overhead_s))]
        self.noise = noise
        self.comm_s = comm_s
        self.random = random.Random(seed)
        self.now = 0.0

    def step(self, split: Sequence[int]) -> tuple[list[tuple[float, float]], float]:
        """Run one synchronous step; return each rank's (busy, floor) seconds and the step's wall seconds."""
        start = self.now
        busy = []
        for k, b in enumerate(split):
            need = (self.overhead_s[k] + self.per_sample_s[k] * b) * (1 + self.noise * self.random.uniform(-1, 1))
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
            busy.append((now - start, 0.0 if quota is None else cpu_s / quota.quota_cpus))
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
