"""Docker fixtures: a daemon, a tiny busybox image built locally (no registry is reachable), and containers.

Without a reachable daemon (or without busybox-static) the Docker tests skip with the reason, unless
LIGHTNING_HETERO_REQUIRE_DOCKER=1 (set by .ci/run), where they fail instead.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import uuid
from collections.abc import Callable, Iterator

import docker
import pytest
from docker.errors import DockerException

BUSYBOX_APPLETS = ("sh", "sleep", "cat", "true")


def _unavailable(reason: str) -> None:
    if os.environ.get("LIGHTNING_HETERO_REQUIRE_DOCKER") == "1":
        pytest.fail(f"{reason} (LIGHTNING_HETERO_REQUIRE_DOCKER=1)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client() -> Iterator:
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except DockerException as err:
        _unavailable(f"no reachable Docker daemon: {err}")
    yield client
    client.close()


@pytest.fixture(scope="session")
def busybox_image(docker_client) -> Iterator[str]:
    """``docker import`` of a rootfs holding Debian's static busybox and a few applet links."""
    busybox = shutil.which("busybox") or "/bin/busybox"
    if not os.path.exists(busybox):
        _unavailable("busybox-static is not installed (apt-get install busybox-static)")
    rootfs = io.BytesIO()
    with tarfile.open(fileobj=rootfs, mode="w") as tar:
        tar.add(busybox, arcname="bin/busybox")
        for applet in BUSYBOX_APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    tag = f"lightning-hetero-test-busybox:{uuid.uuid4().hex[:12]}"
    repository, version = tag.split(":")
    docker_client.api.import_image_from_data(rootfs.getvalue(), repository=repository, tag=version)
    try:
        docker_client.containers.run(tag, ["/bin/true"], remove=True)
    except DockerException as err:
        docker_client.images.remove(tag, force=True)
        _unavailable(f"{busybox} does not run in an empty image (is it busybox-static?): {err}")
    yield tag
    docker_client.images.remove(tag, force=True)


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    prefix = f"lh-test-{uuid.uuid4().hex[:8]}"
    return lambda name: f"{prefix}-{name}"


@pytest.fixture
def make_containers(docker_client, busybox_image, unique_name) -> Iterator[Callable[[int], list[str]]]:
    """Start ``n`` idle busybox containers with unique names; they are removed after the test."""
    created = []

    def make(n: int) -> list[str]:
        names = [unique_name(f"w{i}") for i in range(n)]
        for name in names:
            created.append(docker_client.containers.run(busybox_image, ["/bin/sleep", "3600"], name=name, detach=True))
        return names

    yield make
    for container in created:
        container.remove(force=True)
