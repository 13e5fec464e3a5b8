"""Docker glue: apply planned updates to containers, and create or remove the worker containers.

Talks to the daemon through the Docker SDK for Python only. Every container is looked up before any is updated,
and when an update fails the containers already changed are put back, so a level is never half-applied.

Example (it needs a daemon, so it is not a doctest)::

    backend = DockerBackend.connect()
    config = load_config(overrides=["level=HL2"])
    run_static(config, backend)  # lightning_hetero.emulation.runner
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.models.containers import Container

from lightning_hetero.emulation.config import EmulationConfig
from lightning_hetero.emulation.plan import ContainerUpdate
from lightning_hetero.emulation.progress import PROGRESS_DIR_ENV
from lightning_hetero.emulation.runner import BackendError

log = logging.getLogger("lightning_hetero.emulation")

#: Port of the training rendezvous on the first container (Lightning reads MASTER_ADDR/MASTER_PORT/NODE_RANK).
MASTER_PORT = "29500"
#: Label set on containers made by ``cluster up``.
WORKER_LABEL = "io.lightning-hetero.worker"


#: Prints a container's CFS settings and statistics from inside it, for cgroup v2 and v1.
_CPU_CGROUP_SCRIPT = """
if [ -f /sys/fs/cgroup/cpu.max ]; then
    read quota period < /sys/fs/cgroup/cpu.max; stat=/sys/fs/cgroup/cpu.stat
else
    quota=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us); period=$(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)
    stat=/sys/fs/cgroup/cpu/cpu.stat
fi
echo quota $quota; echo period $period; cat $stat
"""


class DockerBackendError(BackendError):
    """The daemon is unreachable, a container or image is missing, or Docker refused a change."""


@dataclass(frozen=True)
class CpuCgroup:
    """A container's CFS bandwidth settings and throttling counters, as the kernel holds them.

    Args:
        quota_us: CPU time allowed per period (``None``: unlimited).
        period_us: the CFS period.
        nr_throttled: periods in which the container used up its quota and was stopped.
        throttled_s: total time it spent stopped.
    """

    quota_us: int | None
    period_us: int
    nr_throttled: int
    throttled_s: float

    @classmethod
    def parse(cls, text: str) -> CpuCgroup:
        """Read the output of the in-container script (cgroup v2's ``max``/``throttled_usec``, v1's ``-1``/ns).

        Example::

            >>> CpuCgroup.parse("quota 25000\\nperiod 100000\\nnr_periods 40\\nnr_throttled 30\\nthrottled_usec 2500000")
            CpuCgroup(quota_us=25000, period_us=100000, nr_throttled=30, throttled_s=2.5)
            >>> CpuCgroup.parse("quota -1\\nperiod 100000\\nnr_throttled 0\\nthrottled_time 0").quota_us is None
            True
        """
        values = dict(line.split(maxsplit=1) for line in text.splitlines() if len(line.split()) == 2)
        quota = values["quota"]
        if "throttled_usec" in values:
            throttled_s = int(values["throttled_usec"]) / 1e6
        else:
            throttled_s = int(values.get("throttled_time", 0)) / 1e9
        return cls(
            quota_us=None if quota in ("max", "-1") else int(quota),
            period_us=int(values["period"]),
            nr_throttled=int(values.get("nr_throttled", 0)),
            throttled_s=throttled_s,
        )


class DockerBackend:
    """Applies :class:`~lightning_hetero.emulation.plan.ContainerUpdate` lists through ``container.update``.

    Args:
        client: a ``docker.DockerClient``; use :meth:`connect` to make one with a clear error when unreachable.
    """

    def __init__(self, client: docker.DockerClient | None) -> None:
        self.client = client

    @classmethod
    def connect(cls, base_url: str | None = None, timeout_s: float = 10) -> DockerBackend:
        """Connect to ``base_url`` (default: ``DOCKER_HOST`` or the local socket) and check the daemon answers."""
        where = base_url or os.environ.get("DOCKER_HOST") or "the default socket"
        try:
            client = (
                docker.DockerClient(base_url=base_url, timeout=int(timeout_s))
                if base_url
                else docker.from_env(timeout=int(timeout_s))
            )
            client.ping()
        except DockerException as err:
            raise DockerBackendError(
                f"cannot reach the Docker daemon at {where}: {err}; start it (`sudo systemctl start docker`, or "
                "`sudo dockerd &`) or point --docker-url / DOCKER_HOST at a running one; nothing was changed"
            ) from None
        return cls(client)

    def host_cpus(self) -> int:
        return int(self.client.info()["NCPU"])

    def containers(self, names: Sequence[str]) -> list[Container]:
        """Look up every container by name; a missing one is an error naming all that are missing."""
        found, missing = [], []
        for name in names:
            try:
                found.append(self.client.containers.get(name))
            except NotFound:
                missing.append(name)
        if missing:
            raise DockerBackendError(f"containers not found: {', '.join(missing)}; nothing was changed")
        return found

    def apply(self, updates: Sequence[ContainerUpdate], reason: str) -> None:
        """Update every container, or (if Docker refuses one) restore those already updated and raise."""
        containers = self.containers([update.container for update in updates])
        host_cpus = self.host_cpus()
        done: list[tuple[Container, dict[str, Any]]] = []
        for container, update in zip(containers, updates, strict=True):
            previous = _current_limits(container, host_cpus)
            try:
                container.update(**update.kwargs())
            except APIError as err:
                for changed, limits in reversed(done):
                    changed.update(**limits)
                raise DockerBackendError(
                    f"{update.container}: Docker refused {update.describe()}: {err.explanation or err}; "
                    f"restored {len(done)} container(s) already updated"
                ) from None
            done.append((container, previous))
            log.info("%s: %s", reason, update.describe())

    def set_running(self, names: Sequence[str], running: bool) -> None:
        """Start the named containers again, or kill them (SIGKILL: a machine lost, as a spot instance is)."""
        for container in self.containers(names):
            if running:
                container.start()
            else:
                container.kill()
            log.info("%s: %s", container.name, "started" if running else "killed")

    def cpu_cgroup(self, name: str) -> CpuCgroup:
        """The CFS quota, period and throttling counters that container ``name`` sees in its own cgroup."""
        (container,) = self.containers([name])
        result = container.exec_run(["sh", "-c", _CPU_CGROUP_SCRIPT])
        if result.exit_code != 0:
            raise DockerBackendError(f"{name}: cannot read its CPU cgroup: {result.output.decode(errors='replace')}")
        return CpuCgroup.parse(result.output.decode())

    def create_cluster(self, config: EmulationConfig, initial: Sequence[ContainerUpdate] | None = None) -> None:
        """Start the worker containers (as OmniLearn's ``docker run`` lines do), on one network, sharing progress.

        Args:
            config: names, image, network, progress directory and command.
            initial: CPU limits to start with, one per container in order (``None``: unlimited).
        """
        existing = [name for name in config.containers if self._exists(name)]
        if existing:
            raise DockerBackendError(f"containers already exist: {', '.join(existing)}; run `cluster down` first")
        cluster = config.cluster
        try:
            self.client.images.get(cluster.image)
        except ImageNotFound:
            raise DockerBackendError(
                f"image {cluster.image} not found; build it with `docker/build-image.sh --tag {cluster.image}` "
                "(works without an image registry); nothing was created"
            ) from None
        network = self._network(cluster.network)
        config.progress_dir.mkdir(parents=True, exist_ok=True)
        created = []
        try:
            for rank, name in enumerate(config.containers):
                limits = {}
                if initial is not None:
                    limits = {k: v for k, v in initial[rank].kwargs().items() if not (k == "cpu_quota" and v < 0)}
                created.append(
                    self.client.containers.run(
                        cluster.image,
                        list(cluster.command),
                        name=name,
                        hostname=name,
                        detach=True,
                        network=network.name,
                        shm_size=cluster.shm_size,
                        volumes={str(config.progress_dir): {"bind": cluster.progress_mount, "mode": "rw"}},
                        environment={
                            PROGRESS_DIR_ENV: cluster.progress_mount,
                            "MASTER_ADDR": config.containers[0],
                            "MASTER_PORT": MASTER_PORT,
                            "NODE_RANK": str(rank),
                            "NUM_NODES": str(len(config.containers)),
                        },
                        labels={WORKER_LABEL: config.variant},
                        **limits,
                    )
                )
                log.info("created %s (%s)", name, ", ".join(f"{k}={v}" for k, v in limits.items()) or "no CPU limits")
        except DockerException as err:
            for container in created:
                container.remove(force=True)
            raise DockerBackendError(
                f"creating the workers failed ({err}); removed the {len(created)} created"
            ) from None

    def remove_cluster(self, config: EmulationConfig) -> None:
        """Remove the worker containers (those missing are skipped) and then the network if nothing else uses it."""
        for name in config.containers:
            try:
                self.client.containers.get(name).remove(force=True)
                log.info("removed %s", name)
            except NotFound:
                log.info("%s not found, skipped", name)
        try:
            network = self.client.networks.get(config.cluster.network)
            network.reload()
            if network.attrs.get("Containers"):
                log.info("network %s is still in use, kept", network.name)
            else:
                network.remove()
                log.info("removed network %s", network.name)
        except NotFound:
            pass

    def _exists(self, name: str) -> bool:
        try:
            self.client.containers.get(name)
        except NotFound:
            return False
        return True

    def _network(self, name: str) -> Any:
        try:
            return self.client.networks.get(name)
        except NotFound:
            log.info("created network %s", name)
            return self.client.networks.create(name, driver="bridge")


def _current_limits(container: Container, host_cpus: int) -> dict[str, Any]:
    """The container's CPU limits as ``update`` arguments (Docker reports "unset" as empty or 0)."""
    host_config = container.attrs["HostConfig"]
    return {
        "cpuset_cpus": host_config.get("CpusetCpus") or (f"0-{host_cpus - 1}" if host_cpus > 1 else "0"),
        "cpu_quota": host_config.get("CpuQuota") or -1,
        "cpu_period": host_config.get("CpuPeriod") or 100_000,
    }
