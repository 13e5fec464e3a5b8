"""The emulator's configuration: YAML through OmegaConf, ``key=value`` overrides, and errors that name the bad key.

A config says which containers to drive, which levels exist (OmniLearn's presets and your own) and either one
``level`` (static mode) or a ``schedule`` (dynamic mode). Every field has a default, so overrides alone suffice.

Example::

    >>> config = load_config(overrides=["level=HL4", "host_cpus=2"])
    >>> config.containers, config.level
    (('worker1', 'worker2', 'worker3', 'worker4'), 'HL4')
    >>> [a.cpus for a in config.resolve_level("HL4", host_cpus=2).allocations]
    [0.375, 0.375, 0.25, 1.0]
    >>> try:
    ...     load_config(overrides=["level=HL3"])
    ... except ConfigError as err:
    ...     print(err)
    level: unknown level 'HL3' (known: HL1, HL2, HL4, HL8)

A config file with a user level and a wall-clock schedule::

    variant: bsp
    containers: [worker1, worker2, worker3, worker4]
    levels:
      one_slow: ["0", "1", 0.25, 1.0]     # a string pins cores, a number is a CPU quota
    schedule:
      unit: seconds
      steps: [{start: 0, level: HL1}, {start: 60, level: one_slow}]
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml  # PyYAML, the parser OmegaConf depends on and raises from
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lightning_hetero.emulation.presets import (
    ALLOCATION_MODES,
    OMNILEARN_CORES,
    Allocation,
    Level,
    parse_cpuset,
    preset_level,
)
from lightning_hetero.emulation.schedule import LevelSchedule

DEFAULT_CONTAINERS = {
    "bsp": ("worker1", "worker2", "worker3", "worker4"),
    "asp": ("aspworker1", "aspworker2", "aspworker3", "aspworker4", "aspworker5"),
}

#: Keys whose content is the user's own (level names, schedule steps), not checked against DEFAULTS.
FREE_FORM_KEYS = ("levels", "schedule")


def _yaml_default(value: Any) -> dict[str, Any]:
    """A config field's metadata: its default as written in YAML. The fields of the dataclasses below are the
    schema (:data:`DEFAULTS` is built from them); the validated value is what :func:`load_config` puts in a field."""
    return {"default": value}


class ConfigError(ValueError):
    """An invalid configuration; the message starts with the offending key."""


@dataclass(frozen=True)
class ClusterConfig:
    """How ``cluster up`` creates the worker containers.

    Args:
        image: worker image (see ``docker/Dockerfile``).
        network: user-defined bridge network joining the workers (created when missing).
        progress_mount: where the host's ``progress_dir`` appears inside each container.
        command: the container's main process; the default keeps it running for ``docker exec``.
        shm_size: ``/dev/shm`` size (DataLoader workers need more than Docker's 64 MB default).
    """

    image: str = field(metadata=_yaml_default("lightning-hetero-worker:latest"))
    network: str = field(metadata=_yaml_default("lightning-hetero"))
    progress_mount: str = field(metadata=_yaml_default("/progress"))
    command: tuple[str, ...] = field(metadata=_yaml_default(["sleep", "infinity"]))
    shm_size: str | None = field(metadata=_yaml_default("2g"))


@dataclass(frozen=True)
class EmulationConfig:
    """A validated configuration (build it with :func:`load_config`).

    Args:
        containers: container names, in level order (ASP: parameter server first).
        variant: ``"bsp"`` or ``"asp"``, choosing the preset tables.
        allocation: how presets are scaled: ``"auto"``, ``"cpuset"`` or ``"quota"``.
        host_cpus: cores on the Docker host; ``None`` asks the daemon (or this machine in a dry run).
        cpu_period_us: CFS period for quotas.
        level: static mode's level, or ``None``.
        schedule: dynamic mode's schedule, or ``None``.
        levels: user-defined levels by name.
        progress_dir: host directory the training ranks write their epochs into.
        poll_interval_s: how often dynamic mode reads the progress directory or the clock.
        progress_timeout_s: an epoch schedule gives up after this long without a progress record.
        cluster: container creation settings.
    """

    containers: tuple[str, ...] = field(metadata=_yaml_default(None))
    variant: str = field(metadata=_yaml_default("bsp"))
    allocation: str = field(metadata=_yaml_default("auto"))
    host_cpus: int | None = field(metadata=_yaml_default(None))
    cpu_period_us: int = field(metadata=_yaml_default(100_000))
    level: str | None = field(metadata=_yaml_default(None))
    schedule: LevelSchedule | None = field(metadata=_yaml_default(None))
    levels: Mapping[str, tuple[Allocation, ...]] = field(metadata=_yaml_default({}))
    progress_dir: Path = field(metadata=_yaml_default("/tmp/lightning-hetero/progress"))
    poll_interval_s: float = field(metadata=_yaml_default(1.0))
    progress_timeout_s: float = field(metadata=_yaml_default(1800.0))
    cluster: ClusterConfig = field(metadata={"schema": ClusterConfig})

    def resolve_level(self, name: str, host_cpus: int) -> Level:
        """The named preset scaled to ``host_cpus``, or the user level of that name."""
        if name in self.levels:
            return Level(name, self.levels[name])
        return preset_level(name, self.variant, host_cpus, self.allocation)


def _defaults(schema: type) -> dict[str, Any]:
    return {
        f.name: _defaults(f.metadata["schema"]) if "schema" in f.metadata else copy.deepcopy(f.metadata["default"])
        for f in fields(schema)
    }


#: Every key with its default as written in YAML, from the fields of :class:`EmulationConfig` and
#: :class:`ClusterConfig`.
DEFAULTS: dict[str, Any] = _defaults(EmulationConfig)


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> EmulationConfig:
    """Read ``path`` (YAML, optional), apply ``key=value`` overrides in order, and validate.

    Args:
        path: a YAML file; ``None`` starts from the defaults.
        overrides: OmegaConf dot-list items such as ``level=HL2``, ``containers=[a,b]`` or ``cluster.image=x``.

    Raises:
        ConfigError: naming the key that is unknown, missing or invalid.
    """
    raw = copy.deepcopy(DEFAULTS)
    if path is not None:
        try:
            loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        except (OSError, OmegaConfBaseException, ValueError, yaml.YAMLError) as err:
            raise ConfigError(f"{path}: {err}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of keys at the top level")
        _merge(raw, loaded, DEFAULTS, "")
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"{item}: overrides are key=value")
        try:
            parsed = OmegaConf.to_container(OmegaConf.from_dotlist([item]), resolve=True)
        except OmegaConfBaseException as err:
            raise ConfigError(f"{item.split('=', 1)[0]}: {err}") from None
        except yaml.YAMLError as err:
            raise ConfigError(
                f"{item.split('=', 1)[0]}: not valid YAML ({' '.join(str(err).split())}); inside {{...}} and [...] put a "
                "space after each ':', e.g. schedule='{unit: seconds, steps: [[0, HL2]]}'"
            ) from None
        _merge(raw, parsed, DEFAULTS, "")
    return _validate(raw)


def _merge(base: dict[str, Any], new: Mapping[str, Any], schema: Mapping[str, Any] | None, prefix: str) -> None:
    for key, value in new.items():
        name = f"{prefix}{key}"
        if schema is not None and key not in schema:
            raise ConfigError(f"{name}: unknown key (known: {', '.join(schema)})")
        child_schema = schema.get(key) if schema is not None and key not in FREE_FORM_KEYS else None
        if key == "schedule" and isinstance(value, dict) and isinstance(base.get(key), str):
            # a key set on a named schedule would replace the whole preset with that one key
            raise ConfigError(
                f"{name}.{next(iter(value), 'unit')}: schedule {base[key]!r} is a named schedule, by epoch, and has no "
                "settings; a schedule in seconds needs its own steps, in seconds: "
                "schedule='{unit: seconds, steps: [{start: 0, level: HL1}, {start: 600, level: HL4}]}'"
            )
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value, child_schema if isinstance(child_schema, dict) else None, f"{name}.")
        else:
            base[key] = value


def _validate(raw: dict[str, Any]) -> EmulationConfig:
    variant = _choice(raw, "variant", tuple(OMNILEARN_CORES))
    allocation = _choice(raw, "allocation", ALLOCATION_MODES)
    containers = _containers(raw["containers"], variant)
    levels = {
        name: _user_level(name, spec, len(containers)) for name, spec in _mapping(raw["levels"], "levels").items()
    }
    clash = sorted(set(levels) & set(OMNILEARN_CORES[variant]))
    if clash:
        raise ConfigError(f"levels.{clash[0]}: the name is taken by a preset; choose another")
    known = [*OMNILEARN_CORES[variant], *levels]

    def check_level(name: Any, key: str) -> str:
        if not isinstance(name, str) or name not in known:
            raise ConfigError(f"{key}: unknown level {name!r} (known: {', '.join(known)})")
        if name not in levels and len(OMNILEARN_CORES[variant][name]) != len(containers):
            raise ConfigError(
                f"containers: preset {name} ({variant}) needs {len(OMNILEARN_CORES[variant][name])} containers, "
                f"got {len(containers)}"
            )
        return name

    level = None if raw["level"] is None else check_level(raw["level"], "level")
    schedule = None if raw["schedule"] is None else _schedule(raw["schedule"], check_level)
    if level is not None and schedule is not None:
        raise ConfigError("level: set either level (static mode) or schedule (dynamic mode), not both")
    cluster = _mapping(raw["cluster"], "cluster")
    command = cluster["command"]
    scalar = (str, int, float)
    if not isinstance(command, list) or not command or not all(isinstance(part, scalar) for part in command):
        raise ConfigError(f"cluster.command: expected a non-empty list of arguments, got {command!r}")
    mount = _string(cluster["progress_mount"], "cluster.progress_mount")
    if not mount.startswith("/"):
        raise ConfigError(f"cluster.progress_mount: must be an absolute path, got {mount!r}")
    return EmulationConfig(
        containers=containers,
        variant=variant,
        allocation=allocation,
        host_cpus=None if raw["host_cpus"] is None else _positive_int(raw["host_cpus"], "host_cpus"),
        cpu_period_us=_period(raw["cpu_period_us"]),
        level=level,
        schedule=schedule,
        levels=levels,
        progress_dir=Path(_string(raw["progress_dir"], "progress_dir")).absolute(),
        poll_interval_s=_positive_float(raw["poll_interval_s"], "poll_interval_s"),
        progress_timeout_s=_positive_float(raw["progress_timeout_s"], "progress_timeout_s"),
        cluster=ClusterConfig(
            image=_string(cluster["image"], "cluster.image"),
            network=_string(cluster["network"], "cluster.network"),
            progress_mount=mount,
            command=tuple(str(part) for part in command),
            shm_size=None if cluster["shm_size"] is None else _string(cluster["shm_size"], "cluster.shm_size"),
        ),
    )


def _choice(raw: Mapping[str, Any], key: str, choices: Sequence[str]) -> str:
    if raw[key] not in choices:
        raise ConfigError(f"{key}: expected one of {', '.join(choices)}, got {raw[key]!r}")
    return raw[key]


def _mapping(value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a mapping, got {value!r}")
    return value


def _string(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: expected a non-empty string, got {value!r}")
    return value


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key}: expected a positive integer, got {value!r}")
    return value


def _positive_float(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"{key}: expected a positive number, got {value!r}")
    return float(value)


def _period(value: Any) -> int:
    period = _positive_int(value, "cpu_period_us")
    if not 1000 <= period <= 1_000_000:
        raise ConfigError(f"cpu_period_us: the kernel accepts 1000..1000000 microseconds, got {period}")
    return period


def _containers(value: Any, variant: str) -> tuple[str, ...]:
    if value is None:
        return DEFAULT_CONTAINERS[variant]
    if not isinstance(value, list) or not value:
        raise ConfigError(f"containers: expected a non-empty list of container names, got {value!r}")
    names = tuple(_string(name, f"containers[{i}]") for i, name in enumerate(value))
    if len(set(names)) != len(names):
        raise ConfigError(f"containers: names must be unique, got {list(names)}")
    return names


def _user_level(name: str, spec: Any, num_containers: int) -> tuple[Allocation, ...]:
    key = f"levels.{name}"
    if not isinstance(spec, list):
        raise ConfigError(f"{key}: expected a list with one allocation per container, got {spec!r}")
    if len(spec) != num_containers:
        raise ConfigError(f"{key}: {len(spec)} allocations for {num_containers} containers")
    return tuple(_allocation(item, f"{key}[{i}]") for i, item in enumerate(spec))


def _allocation(item: Any, key: str) -> Allocation:
    """A cpuset string, a CPU quota number, or a mapping with ``cpuset`` and/or ``cpus``."""
    if isinstance(item, str):
        item = {"cpuset": item}
    elif isinstance(item, (int, float)) and not isinstance(item, bool):
        item = {"cpus": item}
    if not isinstance(item, dict) or not item:
        raise ConfigError(f"{key}: expected a cpuset string, a number of CPUs, or {{cpuset: ..., cpus: ...}}")
    unknown = sorted(set(item) - {"cpuset", "cpus"})
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]}: unknown key (known: cpuset, cpus)")
    cpuset = item.get("cpuset")
    if cpuset is not None:
        cpuset = str(cpuset)
        try:
            parse_cpuset(cpuset)
        except ValueError as err:
            raise ConfigError(f"{key}.cpuset: {err}") from None
    cpus = item.get("cpus")
    if cpus is not None:
        try:
            cpus = _positive_float(cpus, f"{key}.cpus")
        except ConfigError as err:
            if isinstance(cpus, int) and not isinstance(cpus, bool):
                raise ConfigError(
                    f"{err}; a number is a CPU quota, a cpuset must be a string: quote it, as in "
                    "\"levels.NAME=['0','1']\" on the command line"
                ) from None
            raise
    return Allocation(cpuset=cpuset, cpus=cpus)


def _schedule(value: Any, check_level: Any) -> LevelSchedule:
    if isinstance(value, str):
        try:
            schedule = LevelSchedule.named(value)
        except ValueError as err:
            raise ConfigError(f"schedule: {err}") from None
    else:
        spec = _mapping(value, "schedule")
        unknown = sorted(set(spec) - {"unit", "steps"})
        if unknown:
            raise ConfigError(f"schedule.{unknown[0]}: unknown key (known: unit, steps)")
        steps = spec.get("steps")
        if not isinstance(steps, list) or not steps:
            raise ConfigError("schedule.steps: expected a non-empty list of {start: ..., level: ...}")
        pairs = []
        for i, step in enumerate(steps):
            if not isinstance(step, dict) or set(step) != {"start", "level"}:
                raise ConfigError(f"schedule.steps[{i}]: expected {{start: ..., level: ...}}, got {step!r}")
            start = step["start"]
            if isinstance(start, bool) or not isinstance(start, (int, float)) or not 0 <= start < math.inf:
                raise ConfigError(f"schedule.steps[{i}].start: expected a number >= 0, got {start!r}")
            pairs.append((start, step["level"]))
        try:
            schedule = LevelSchedule.from_steps(spec.get("unit", "epoch"), pairs)
        except ValueError as err:
            raise ConfigError(f"schedule: {err}") from None
    for i, name in enumerate(schedule.levels):
        check_level(name, f"schedule.steps[{i}].level")
    return schedule
