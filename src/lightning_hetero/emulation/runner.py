"""Static and dynamic emulation: which level to apply when, fed to any backend that can apply updates.

Every level a run can reach is planned (and so validated) before the first update, so a bad level late in a
schedule fails at start-up rather than halfway through training. The backend is anything with ``host_cpus()`` and
``apply(updates, reason)``: :class:`~lightning_hetero.emulation.docker_backend.DockerBackend` in real runs, a fake
in tests.

Example::

    >>> from lightning_hetero.emulation.config import load_config
    >>> config = load_config(overrides=["level=HL2", "host_cpus=48"])
    >>> print("\\n".join(describe_plan(config, host_cpus=48)))
    HL2 (static):
      worker1: cpuset_cpus=0-11 cpu_quota=-1 cpu_period=100000
      worker2: cpuset_cpus=12-23 cpu_quota=-1 cpu_period=100000
      worker3: cpuset_cpus=24-31 cpu_quota=-1 cpu_period=100000
      worker4: cpuset_cpus=32-47 cpu_quota=-1 cpu_period=100000
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from lightning_hetero.emulation.config import EmulationConfig
from lightning_hetero.emulation.plan import ContainerUpdate, plan_level
from lightning_hetero.emulation.progress import read_progress

log = logging.getLogger("lightning_hetero.emulation")


class BackendError(RuntimeError):
    """A backend could not reach its containers or apply a change."""


class NoProgressError(BackendError):
    """An epoch schedule saw no training progress for ``progress_timeout_s``."""


class Backend(Protocol):
    def host_cpus(self) -> int: ...

    def apply(self, updates: Sequence[ContainerUpdate], reason: str) -> None: ...


def plan_levels(config: EmulationConfig, host_cpus: int) -> dict[str, list[ContainerUpdate]]:
    """The updates for every level the config's static level or schedule uses, in first-use order."""
    if config.level is not None:
        names = [config.level]
    elif config.schedule is not None:
        names = list(dict.fromkeys(config.schedule.levels))
    else:
        raise ValueError("nothing to emulate: set level (static mode) or schedule (dynamic mode)")
    return {
        name: plan_level(config.resolve_level(name, host_cpus), config.containers, host_cpus, config.cpu_period_us)
        for name in names
    }


def describe_plan(config: EmulationConfig, host_cpus: int) -> list[str]:
    """Human-readable lines for ``--dry-run``: each transition and the updates it makes."""
    plans = plan_levels(config, host_cpus)
    if config.schedule is None:
        steps = [(f"{config.level} (static)", config.level)]
    else:
        unit = config.schedule.unit
        steps = [
            (f"{unit} {start:g}: {name}", name)
            for start, name in zip(config.schedule.starts, config.schedule.levels, strict=True)
        ]
    lines = []
    for title, name in steps:
        lines.append(f"{title}:")
        lines.extend(f"  {update.describe()}" for update in plans[name])
    return lines


def run_static(config: EmulationConfig, backend: Backend) -> None:
    """Apply the config's single level."""
    plans = plan_levels(config, backend.host_cpus())
    backend.apply(plans[config.level], reason=f"{config.level} (static)")


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Raise ``KeyboardInterrupt`` on SIGINT or SIGTERM inside the block, then restore the previous handlers.

    A shell script starts background jobs (``lightning-hetero emulate ... &``) with SIGINT ignored, so without this
    Ctrl-C would stop the script but leave the emulator polling; SIGTERM would end it without a word. The exception
    carries the signal number as ``signum``. Outside the main thread (where Python cannot set handlers) it does
    nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        interrupt = KeyboardInterrupt(signal.Signals(signum).name)
        interrupt.signum = signum  # type: ignore[attr-defined]
        raise interrupt

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_dynamic(
    config: EmulationConfig,
    backend: Backend,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Follow the config's schedule until its last level is in force or training reports that it finished.

    With an epoch schedule the position is the most advanced rank's epoch in ``progress_dir``; records written
    before this call started (a previous run's) are ignored, and when no rank has written a record for
    ``progress_timeout_s`` (training never started, or died) it raises :class:`NoProgressError`. With a seconds
    schedule the position is the time since the call. SIGINT and SIGTERM stop it (see :func:`stop_on_signals`).

    Args:
        config: a config with a schedule.
        backend: applies the updates.
        clock: wall-clock seconds (``time.time``; the training side stamps its records with the same clock).
        sleep: waits ``poll_interval_s`` between polls.
    """
    schedule = config.schedule
    if schedule is None:
        raise ValueError("dynamic mode needs a schedule")
    plans = plan_levels(config, backend.host_cpus())
    started = clock()
    applied = None
    log.info("following a schedule by %s over %d steps", schedule.unit, len(schedule.levels))
    if schedule.unit != "seconds":
        log.info(
            "reading epochs from %s (lightning_hetero.ProgressReporter); giving up after %g s without a record",
            config.progress_dir,
            config.progress_timeout_s,
        )
    with stop_on_signals():
        while True:
            if schedule.unit == "seconds":
                position = clock() - started
            else:
                records = [r for r in read_progress(config.progress_dir).values() if r.time_s >= started]
                if records and all(r.done for r in records):
                    log.info("training finished (all %d reporting ranks are done)", len(records))
                    return
                silent_s = clock() - max((r.time_s for r in records), default=started)
                if silent_s > config.progress_timeout_s:
                    raise NoProgressError(
                        f"no training progress in {config.progress_dir} for {silent_s:.0f} s "
                        f"(progress_timeout_s={config.progress_timeout_s:g}); is training running with "
                        "lightning_hetero.ProgressReporter, and is that directory mounted into its containers? "
                        "The containers keep their current limits"
                    )
                position = max((r.epoch for r in records), default=0)
            level = schedule.level_at(position)
            if level != applied:
                backend.apply(plans[level], reason=f"{level} at {schedule.unit} {position:g}")
                applied = level
            if position >= schedule.final_start:
                log.info("the schedule's last level (%s) is in force", level)
                return
            sleep(config.poll_interval_s)
