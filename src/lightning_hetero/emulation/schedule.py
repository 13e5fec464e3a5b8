"""A schedule of heterogeneity levels over training epochs or wall-clock seconds: :class:`LevelSchedule` (pure, no
Docker).

Example::

    >>> schedule = LevelSchedule.from_steps("epoch", [(0, "HL1"), (5, "HL2"), (10, "HL1")])
    >>> [schedule.level_at(epoch) for epoch in (0, 4, 5, 9, 10, 99)]
    ['HL1', 'HL1', 'HL2', 'HL2', 'HL1', 'HL1']
    >>> schedule.final_start
    10
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from lightning_hetero._deprecation import renamed_attributes

SCHEDULE_UNITS = ("epoch", "seconds")

#: OmniLearn's dynamic-heterogeneity routines, by epoch (GPT-2 followed the ResNet18 one).
OMNILEARN_SCHEDULES: dict[str, tuple[tuple[int, str], ...]] = {
    "omnilearn-resnet18": ((0, "HL1"), (5, "HL2"), (10, "HL4"), (15, "HL8"), (25, "HL4"), (30, "HL2"), (35, "HL1")),
    "omnilearn-resnet50": (
        (0, "HL1"),
        (25, "HL2"),
        (50, "HL4"),
        (75, "HL8"),
        (125, "HL4"),
        (150, "HL2"),
        (175, "HL1"),
    ),
}


@dataclass(frozen=True)
class LevelSchedule:
    """Levels that start at given epochs or seconds; each holds until the next one starts.

    Args:
        unit: ``"epoch"`` (the training side reports its epoch) or ``"seconds"`` (since the emulator started).
        starts: strictly increasing start positions, the first one 0.
        levels: the level starting at each position.
    """

    unit: str
    starts: tuple[float, ...]
    levels: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.unit not in SCHEDULE_UNITS:
            raise ValueError(f"unit must be one of {', '.join(SCHEDULE_UNITS)}, got {self.unit!r}")
        if not self.starts or len(self.starts) != len(self.levels):
            raise ValueError("a schedule needs at least one step and one level per start")
        if self.starts[0] != 0:
            raise ValueError(f"the first step must start at 0, got {self.starts[0]}")
        if any(b <= a for a, b in zip(self.starts, self.starts[1:], strict=False)):
            raise ValueError(f"starts must increase strictly, got {list(self.starts)}")

    @classmethod
    def from_steps(cls, unit: str, steps: Iterable[tuple[float, str]]) -> LevelSchedule:
        steps = list(steps)
        return cls(unit, tuple(start for start, _ in steps), tuple(level for _, level in steps))

    @classmethod
    def named(cls, name: str) -> LevelSchedule:
        """One of :data:`OMNILEARN_SCHEDULES`, by epoch.

        Example::

            >>> LevelSchedule.named("omnilearn-resnet18").level_at(15)
            'HL8'
        """
        if name not in OMNILEARN_SCHEDULES:
            raise ValueError(f"unknown schedule {name!r} (known: {', '.join(OMNILEARN_SCHEDULES)})")
        return cls.from_steps("epoch", OMNILEARN_SCHEDULES[name])

    def level_at(self, position: float) -> str:
        """The level in force at ``position`` (an epoch, or seconds since the start)."""
        return self.levels[max(0, bisect.bisect_right(self.starts, position) - 1)]

    @property
    def final_start(self) -> float:
        """Where the last level starts; nothing changes after it."""
        return self.starts[-1]


def churn_plan(every_s: float, down_s: float, cycles: int) -> list[tuple[float, str]]:
    """When to stop and start a worker to script churn (an elastic job's workers leaving and coming back): every
    ``every_s`` seconds it is killed, and ``down_s`` later started again, ``cycles`` times.

    Example::

        >>> churn_plan(every_s=60, down_s=5, cycles=2)
        [(60.0, 'stop'), (65.0, 'start'), (120.0, 'stop'), (125.0, 'start')]
        >>> churn_plan(every_s=5, down_s=5, cycles=1)
        Traceback (most recent call last):
        ...
        ValueError: down_s=5 must be shorter than every_s=5
    """
    if every_s <= 0 or down_s <= 0 or cycles < 1:
        raise ValueError(f"every_s and down_s must be > 0 and cycles >= 1, got {every_s}, {down_s}, {cycles}")
    if down_s >= every_s:
        raise ValueError(f"down_s={down_s:g} must be shorter than every_s={every_s:g}")
    plan: list[tuple[float, str]] = []
    for cycle in range(1, cycles + 1):
        plan += [(float(cycle * every_s), "stop"), (float(cycle * every_s + down_s), "start")]
    return plan


# renamed in issue 13 (so that "schedule" alone names no class); the old name goes in the next release
__getattr__ = renamed_attributes(__name__, {"Schedule": ("LevelSchedule", LevelSchedule)})
