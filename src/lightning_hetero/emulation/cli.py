"""The ``lightning-hetero`` console script: emulate heterogeneity on Docker workers, and create or remove them.

Example::

    >>> main(["emulate", "--dry-run", "level=HL8", "host_cpus=48"])
    dry run: 48 host CPUs (from the config); nothing is changed
    HL8 (static):
      worker1: cpuset_cpus=0-5 cpu_quota=-1 cpu_period=100000
      worker2: cpuset_cpus=6-11 cpu_quota=-1 cpu_period=100000
      worker3: cpuset_cpus=12-15 cpu_quota=-1 cpu_period=100000
      worker4: cpuset_cpus=16-47 cpu_quota=-1 cpu_period=100000
    0
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from lightning_hetero.emulation.config import ConfigError, EmulationConfig, load_config
from lightning_hetero.emulation.plan import ContainerUpdate, PlanError, plan_level
from lightning_hetero.emulation.presets import OMNILEARN_CORES, TABLE_HOST_CPUS
from lightning_hetero.emulation.runner import BackendError, describe_plan, run_dynamic, run_static
from lightning_hetero.emulation.schedule import OMNILEARN_SCHEDULES, churn_plan

if TYPE_CHECKING:
    from lightning_hetero.emulation.docker_backend import DockerBackend

EXIT_USAGE = 2
EXIT_FAILED = 1


def catalogue() -> str:
    """The preset levels and named schedules, for ``--help``.

    Example::

        >>> print(catalogue().splitlines()[1])
          variant=bsp (worker1-4)                HL1 12,12,12,12  HL2 12,12,8,16  HL4 9,9,6,24  HL8 6,6,4,32
    """
    lines = [f"levels (cores per container on a {TABLE_HOST_CPUS}-core host, scaled to the Docker host's cores):"]
    for variant, containers in (("bsp", "worker1-4"), ("asp", "aspworker1 = server, 2-5")):
        levels = "  ".join(f"{name} {','.join(map(str, cores))}" for name, cores in OMNILEARN_CORES[variant].items())
        lines.append(f"  {f'variant={variant} ({containers})':<38} {levels}")
    lines.append("  your own: levels.NAME=[1.0,1.0,1.0,0.25] level=NAME (CPUs or quoted cpuset strings per container)")
    lines.append("schedules (by epoch, from ProgressReporter's records):")
    for name, steps in OMNILEARN_SCHEDULES.items():
        lines.append(f"  {name:<20} " + "  ".join(f"{start}: {level}" for start, level in steps))
    lines.append(
        "  your own: schedule='{unit: epoch|seconds, steps: [{start: 0, level: HL1}, {start: 600, level: HL4}]}'"
    )
    lines += [
        "examples:",
        "  lightning-hetero emulate --dry-run level=HL4",
        "  lightning-hetero emulate schedule=omnilearn-resnet18",
        "  lightning-hetero cluster up level=HL1",
        "configuration reference: https://github.com/lightning-hetero/lightning-hetero/blob/main/docs/emulation.md",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-hetero",
        description="Emulate heterogeneous workers with Docker CPU limits (cpusets and quotas).",
        epilog=catalogue(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def add_common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("-c", "--config", help="YAML config (see docs/emulation.md); overrides apply on top")
        sub.add_argument("--dry-run", action="store_true", help="print the planned changes without touching Docker")
        sub.add_argument("--docker-url", help="Docker daemon URL (default: DOCKER_HOST or the local socket)")
        sub.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. level=HL4")

    emulate = commands.add_parser(
        "emulate",
        help="apply a level (static) or follow a schedule by epoch or wall-clock time (dynamic)",
        description="Static mode applies `level`; dynamic mode follows `schedule`, reading epochs from "
        "`progress_dir` (written by lightning_hetero.ProgressReporter) or the clock.",
        epilog=catalogue(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common(emulate)
    cluster = commands.add_parser("cluster", help="create or remove the worker containers")
    cluster_commands = cluster.add_subparsers(dest="action", required=True)
    add_common(cluster_commands.add_parser("up", help="create the workers at the initial level"))
    add_common(cluster_commands.add_parser("down", help="remove the workers and their network"))
    for action, text in (
        ("stop", "kill worker containers mid-run (machines lost)"),
        ("start", "start killed worker containers again (they rejoin an elastic job)"),
        ("churn", "kill a worker every --every-s seconds and start it --down-s later, --cycles times"),
    ):
        sub = cluster_commands.add_parser(action, help=text)
        add_common(sub)
        sub.add_argument("--workers", required=True, help="comma-separated container names, e.g. worker2")
        if action == "churn":
            sub.add_argument("--every-s", type=float, default=60.0)
            sub.add_argument("--down-s", type=float, default=5.0)
            sub.add_argument("--cycles", type=int, default=1)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    formatter = logging.Formatter("%(asctime)s %(message)s", datefmt="%Y-%m-%dT%H:%M:%SZ")
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    logger = logging.getLogger("lightning_hetero.emulation")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        config = load_config(args.config, args.overrides)
        status = _emulate(config, args) if args.command == "emulate" else _cluster(config, args)
        sys.stdout.flush()  # a closed pipe shows here, not as a traceback at exit
        return status
    except BrokenPipeError:
        # the reader stopped early (`emulate --dry-run ... | head`); nothing more is printed
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ConfigError, PlanError, ValueError) as err:
        print(f"lightning-hetero: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except BackendError as err:
        print(f"lightning-hetero: error: {err}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt as interrupt:
        logger.info("interrupted; the containers keep their current limits")
        return 128 + getattr(interrupt, "signum", 2)  # 130 for Ctrl-C, 143 for SIGTERM
    finally:
        logger.removeHandler(handler)


def _emulate(config: EmulationConfig, args: argparse.Namespace) -> int:
    if config.level is None and config.schedule is None:
        raise ConfigError("level: emulate needs level=<name> (static mode) or schedule=... (dynamic mode)")
    if args.dry_run:
        host_cpus = _dry_run_host_cpus(config)
        for line in describe_plan(config, host_cpus):
            print(line)
        return 0
    backend = _connect(args)
    if config.schedule is None:
        run_static(config, backend)
    else:
        run_dynamic(config, backend)
    return 0


def _churn(args: argparse.Namespace) -> int:
    """``cluster stop|start|churn``: workers leaving and coming back (see ``docs/elastic.md``)."""
    names = [name for name in args.workers.split(",") if name]
    plan = [(0.0, args.action)] if args.action != "churn" else churn_plan(args.every_s, args.down_s, args.cycles)
    if args.dry_run:
        for at_s, action in plan:
            print(f"at {at_s:g} s: {action} {', '.join(names)}")
        return 0
    backend = _connect(args)
    start = time.monotonic()
    for at_s, action in plan:
        time.sleep(max(0.0, start + at_s - time.monotonic()))
        backend.set_running(names, running=action == "start")
    return 0


def _cluster(config: EmulationConfig, args: argparse.Namespace) -> int:
    if args.action in ("stop", "start", "churn"):
        return _churn(args)
    initial_level = config.level or (config.schedule.level_at(0) if config.schedule is not None else None)
    if args.action == "down":
        if args.dry_run:
            print(f"would remove containers {', '.join(config.containers)} and network {config.cluster.network}")
            return 0
        _connect(args).remove_cluster(config)
        return 0
    if args.dry_run:
        host_cpus = _dry_run_host_cpus(config)
        initial = _initial_updates(config, initial_level, host_cpus)
        print(f"would create network {config.cluster.network} and, from image {config.cluster.image}:")
        for rank, name in enumerate(config.containers):
            limits = initial[rank].describe() if initial else f"{name}: no CPU limits"
            print(f"  {limits} (NODE_RANK={rank}, {config.progress_dir} -> {config.cluster.progress_mount})")
        return 0
    backend = _connect(args)
    backend.create_cluster(config, _initial_updates(config, initial_level, backend.host_cpus()))
    return 0


def _initial_updates(config: EmulationConfig, level: str | None, host_cpus: int) -> list[ContainerUpdate] | None:
    if level is None:
        return None
    return plan_level(config.resolve_level(level, host_cpus), config.containers, host_cpus, config.cpu_period_us)


def _dry_run_host_cpus(config: EmulationConfig) -> int:
    if config.host_cpus is not None:
        print(f"dry run: {config.host_cpus} host CPUs (from the config); nothing is changed")
        return config.host_cpus
    host_cpus = os.cpu_count() or 1
    print(f"dry run: {host_cpus} host CPUs (this machine's; set host_cpus=N for another host); nothing is changed")
    return host_cpus


def _connect(args: argparse.Namespace) -> DockerBackend:
    # imported here so that `import lightning_hetero` and dry runs never load the Docker SDK
    from lightning_hetero.emulation.docker_backend import DockerBackend

    return DockerBackend.connect(args.docker_url)


if __name__ == "__main__":
    sys.exit(main())
