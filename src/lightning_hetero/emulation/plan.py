"""Turning a level into the ``container.update(...)`` calls that apply it, checked before anything is touched.

Every update sets the cpuset, the quota and the period together, so a level never inherits a limit from the one
before it: a quota-only level pins to all host cores, and a cpuset-only level lifts the quota (``cpu_quota=-1``).

Example::

    >>> from lightning_hetero.emulation.presets import Allocation, Level
    >>> level = Level("mine", (Allocation(cpuset="0"), Allocation(cpus=0.5)))
    >>> for update in plan_level(level, ["w1", "w2"], host_cpus=2):
    ...     print(update.describe())
    w1: cpuset_cpus=0 cpu_quota=-1 cpu_period=100000
    w2: cpuset_cpus=0-1 cpu_quota=50000 cpu_period=100000
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning_hetero.emulation.presets import Level, parse_cpuset

#: The kernel refuses CFS quotas below 1 ms.
MIN_CPU_QUOTA_US = 1000


class PlanError(ValueError):
    """A level that cannot be applied to these containers on this host."""


@dataclass(frozen=True)
class ContainerUpdate:
    """One ``container.update(...)`` call.

    Args:
        container: container name.
        cpuset_cpus: pinned cores, ``--cpuset-cpus`` syntax.
        cpu_quota: CFS quota in microseconds per period; ``-1`` is unlimited.
        cpu_period: CFS period in microseconds.
    """

    container: str
    cpuset_cpus: str
    cpu_quota: int
    cpu_period: int

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``docker.models.containers.Container.update``."""
        return {"cpuset_cpus": self.cpuset_cpus, "cpu_quota": self.cpu_quota, "cpu_period": self.cpu_period}

    def describe(self) -> str:
        return f"{self.container}: " + " ".join(f"{key}={value}" for key, value in self.kwargs().items())


def plan_level(
    level: Level, containers: Sequence[str], host_cpus: int, cpu_period_us: int = 100_000
) -> list[ContainerUpdate]:
    """The updates that put ``containers`` (in order) at ``level`` on a host with ``host_cpus`` cores.

    Args:
        level: one allocation per container.
        containers: container names, in the level's order.
        host_cpus: cores on the Docker host; cpusets must lie within ``0 .. host_cpus - 1``.
        cpu_period_us: CFS period used for quotas.

    Raises:
        PlanError: naming the level and container whose allocation does not fit.
    """
    if len(level.allocations) != len(containers):
        raise PlanError(
            f"level {level.name} has {len(level.allocations)} allocations but there are {len(containers)} containers"
        )
    all_cores = f"0-{host_cpus - 1}" if host_cpus > 1 else "0"
    updates = []
    for container, allocation in zip(containers, level.allocations, strict=True):
        where = f"level {level.name}, container {container}"
        cores = host_cpus
        if allocation.cpuset is not None:
            try:
                pinned = parse_cpuset(allocation.cpuset)
            except ValueError as err:
                raise PlanError(f"{where}: {err}") from None
            beyond = sorted(core for core in pinned if core >= host_cpus)
            if beyond:
                raise PlanError(
                    f"{where}: cpuset {allocation.cpuset} names cores {beyond} beyond the host's {host_cpus}"
                )
            cores = len(pinned)
        quota = -1
        if allocation.cpus is not None:
            if not 0 < allocation.cpus <= cores:
                raise PlanError(f"{where}: cpus={allocation.cpus} must be in (0, {cores}], the cores it may use")
            quota = round(allocation.cpus * cpu_period_us)
            if quota < MIN_CPU_QUOTA_US:
                raise PlanError(f"{where}: cpus={allocation.cpus} is below the kernel's 1 ms quota per period")
        updates.append(ContainerUpdate(container, allocation.cpuset or all_cores, quota, cpu_period_us))
    return updates
