"""CPU allocations for emulated workers: OmniLearn's heterogeneity levels (HL) scaled to a host, and user levels.

A *level* gives every worker container an :class:`Allocation`: a set of pinned cores (``cpuset``), a CPU quota in
CPUs (``cpus``, as in ``docker run --cpus``), or both. OmniLearn's tables were measured on a 48-core host; on another
host the cores are scaled by ``host_cpus / 48``, either as whole pinned cores (``allocation="cpuset"``, what
OmniLearn did) or as fractional quotas (``allocation="quota"``, the only way to keep the ratios on a host with few
cores). ``"auto"`` pins when the host has at least 48 cores and uses quotas otherwise.

Example::

    >>> level = preset_level("HL8", variant="bsp", host_cpus=96)
    >>> [a.cpuset for a in level.allocations]
    ['0-11', '12-23', '24-31', '32-95']
    >>> [a.cpus for a in preset_level("HL2", variant="bsp", host_cpus=4).allocations]
    [1.0, 1.0, 0.667, 1.333]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lightning_hetero._validation import check_range

#: OmniLearn's heterogeneity levels, in cores per container of a 48-core host. ASP lists the parameter server first.
OMNILEARN_CORES: dict[str, dict[str, tuple[int, ...]]] = {
    "bsp": {"HL1": (12, 12, 12, 12), "HL2": (12, 12, 8, 16), "HL4": (9, 9, 6, 24), "HL8": (6, 6, 4, 32)},
    "asp": {
        "HL1": (8, 10, 10, 10, 10),
        "HL2": (8, 8, 8, 8, 16),
        "HL4": (8, 10, 10, 4, 16),
        "HL8": (8, 4, 4, 4, 28),
    },
}
TABLE_HOST_CPUS = 48
ALLOCATION_MODES = ("auto", "cpuset", "quota")


@dataclass(frozen=True)
class Allocation:
    """The CPU share of one container.

    Args:
        cpuset: pinned cores in Docker's ``--cpuset-cpus`` syntax (``"0-3,8"``); ``None`` allows every host core.
        cpus: CPU quota in CPUs (``0.5`` is half a core); ``None`` is unlimited.
    """

    cpuset: str | None = None
    cpus: float | None = None

    def describe(self) -> str:
        parts = [f"cpuset {self.cpuset}" if self.cpuset is not None else "all cores"]
        if self.cpus is not None:
            parts.append(f"{self.cpus:g} CPU")
        return ", ".join(parts)


@dataclass(frozen=True)
class Level:
    """A named heterogeneity level: one allocation per container, in container order."""

    name: str
    allocations: tuple[Allocation, ...]


def parse_cpuset(text: str) -> frozenset[int]:
    """The cores named by a ``--cpuset-cpus`` string.

    Example::

        >>> sorted(parse_cpuset("0-2,5"))
        [0, 1, 2, 5]
    """
    cores: set[int] = set()
    for part in str(text).split(","):
        first, sep, last = part.strip().partition("-")
        if not first.isdigit() or (sep and not last.isdigit()):
            raise ValueError(f"invalid cpuset {text!r}: expected a list like '0-3,8'")
        low, high = int(first), int(last) if sep else int(first)
        if high < low:
            raise ValueError(f"invalid cpuset {text!r}: range {part.strip()} runs backwards")
        cores.update(range(low, high + 1))
    return frozenset(cores)


def apportion(weights: Sequence[float], total: int, minimum: int = 1) -> list[int]:
    """Integers proportional to ``weights`` that sum to ``total``, each at least ``minimum`` (largest remainder).

    Example::

        >>> apportion([6, 6, 4, 32], 8)
        [1, 1, 1, 5]
    """
    if total < minimum * len(weights):
        raise ValueError(f"cannot give {len(weights)} workers at least {minimum} of {total}")
    exact = [total * w / sum(weights) for w in weights]
    shares = [max(minimum, int(x)) for x in exact]
    while sum(shares) < total:
        shares[max(range(len(shares)), key=lambda i: exact[i] - shares[i])] += 1
    while sum(shares) > total:
        reducible = [i for i in range(len(shares)) if shares[i] > minimum]
        shares[min(reducible, key=lambda i: exact[i] - shares[i])] -= 1
    return shares


def pinned_level(name: str, cores: Sequence[int]) -> Level:
    """A level of contiguous, disjoint cpusets with the given core counts, starting at core 0."""
    allocations, first = [], 0
    for count in cores:
        last = first + count - 1
        allocations.append(Allocation(cpuset=f"{first}-{last}" if count > 1 else str(first)))
        first = last + 1
    return Level(name, tuple(allocations))


def preset_level(name: str, variant: str = "bsp", host_cpus: int = TABLE_HOST_CPUS, allocation: str = "auto") -> Level:
    """One of OmniLearn's HL1/HL2/HL4/HL8 levels scaled to ``host_cpus``.

    Args:
        name: ``"HL1"``, ``"HL2"``, ``"HL4"`` or ``"HL8"``.
        variant: ``"bsp"`` (4 workers) or ``"asp"`` (parameter server + 4 workers).
        host_cpus: cores on the Docker host.
        allocation: ``"cpuset"`` (whole pinned cores), ``"quota"`` (fractional CPUs) or ``"auto"``.

    Example::

        >>> preset_level("HL4", variant="asp", host_cpus=48, allocation="quota").allocations[3]
        Allocation(cpuset=None, cpus=4.0)
    """
    if variant not in OMNILEARN_CORES:
        raise ValueError(f"unknown variant {variant!r} (known: {', '.join(OMNILEARN_CORES)})")
    table = OMNILEARN_CORES[variant]
    if name not in table:
        raise ValueError(f"unknown preset {name!r} (known: {', '.join(table)})")
    if allocation not in ALLOCATION_MODES:
        raise ValueError(f"unknown allocation {allocation!r} (known: {', '.join(ALLOCATION_MODES)})")
    check_range("host_cpus", host_cpus, low=1, integer=True)
    cores = table[name]
    if allocation == "cpuset" or (allocation == "auto" and host_cpus >= TABLE_HOST_CPUS):
        if host_cpus < len(cores):
            raise ValueError(
                f"{name} with allocation=cpuset pins at least one whole core to each of {len(cores)} containers, "
                f"but the host has {host_cpus} cores; use allocation=quota (fractions of a CPU) on this host"
            )
        return pinned_level(name, apportion(cores, host_cpus))
    scale = host_cpus / TABLE_HOST_CPUS
    return Level(name, tuple(Allocation(cpus=round(c * scale, 3)) for c in cores))
