"""End to end on a real daemon: the worker image, a 2-container cluster under real CPU quotas, DDP training in it.

The image comes from docker/build-image.sh (a Debian base made with debootstrap where no image registry is
reachable); it is reused when its inputs have not changed, so only the first run pays for the build (see README).
.ci/run builds it before the tests, so that its time is logged apart from theirs.
"""

import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lightning_hetero.emulation.cli import main
from lightning_hetero.emulation.docker_backend import DockerBackend

pytestmark = pytest.mark.docker

ROOT = Path(__file__).parents[2]
IMAGE = os.environ.get("LIGHTNING_HETERO_IMAGE", "lightning-hetero-worker:latest")
TRAIN_SCRIPT = ROOT / "tests" / "scripts" / "docker_train.py"
EPOCHS = 3


@pytest.fixture(scope="module")
def worker_image(docker_client) -> str:
    build = subprocess.run(
        [str(ROOT / "docker" / "build-image.sh"), "--tag", IMAGE], capture_output=True, text=True, timeout=1500
    )
    if build.returncode != 0:
        pytest.fail(f"docker/build-image.sh could not build {IMAGE}:\n{build.stderr[-4000:]}")
    return IMAGE


def _train(container, out: str) -> tuple[int, str]:
    # `timeout` bounds a hung rendezvous; the quota-limited rank imports torch and Lightning at a quarter CPU
    command = ["timeout", "600", "python", f"{out}/docker_train.py", out, "--epochs", str(EPOCHS)]
    result = container.exec_run(command, environment={"GLOO_SOCKET_IFNAME": "eth0"})
    return result.exit_code, result.output.decode(errors="replace")


@pytest.mark.timeout(1800)
def test_hetero_batch_training_in_containers_under_real_quotas(docker_client, worker_image, unique_name, tmp_path):
    names = [unique_name("fast"), unique_name("slow")]
    network = unique_name("net")
    overrides = [
        f"containers=[{names[0]},{names[1]}]",
        f"cluster.image={worker_image}",
        f"cluster.network={network}",
        f"progress_dir={tmp_path}",
        "levels.one_slow=[1.0, 0.25]",
    ]
    shutil.copy(TRAIN_SCRIPT, tmp_path / "docker_train.py")
    backend = DockerBackend(docker_client)
    try:
        assert main(["cluster", "up", *overrides]) == 0
        assert backend.cpu_cgroup(names[1]).quota_us is None  # created without limits
        assert main(["emulate", *overrides, "level=one_slow"]) == 0
        fast, slow = (backend.cpu_cgroup(name) for name in names)
        assert (fast.quota_us, fast.period_us) == (100_000, 100_000)
        assert (slow.quota_us, slow.period_us) == (25_000, 100_000)

        containers = [docker_client.containers.get(name) for name in names]
        with ThreadPoolExecutor(len(containers)) as pool:
            runs = list(pool.map(_train, containers, ["/progress"] * len(containers)))
        for name, (code, output) in zip(names, runs, strict=True):
            assert code == 0, f"{name} exited with {code}:\n{output[-4000:]}"
        results = [json.loads((tmp_path / f"result-rank{rank}.json").read_text()) for rank in range(2)]
        assert [r["final_split"] for r in results] == [results[0]["final_split"]] * 2  # the ranks agree
        result = results[0]
        assert result["epochs"] == EPOCHS
        start, final = result["start_split"], result["final_split"]
        assert sum(final) == sum(start)
        # the rank with a whole CPU ends with more of each global batch than it started with, and than the other
        assert final[0] > start[0] and final[0] > final[1], result
        assert backend.cpu_cgroup(names[1]).nr_throttled > slow.nr_throttled  # the kernel did stop the slow rank
    finally:
        assert main(["cluster", "down", *overrides]) == 0
    assert not docker_client.containers.list(all=True, filters={"name": names[0]})
    assert not docker_client.containers.list(all=True, filters={"name": names[1]})
    assert not docker_client.networks.list(names=[network])


def _build(*args: str, **env: str) -> subprocess.CompletedProcess:
    script = str(ROOT / "docker" / "build-image.sh")
    return subprocess.run([script, *args], capture_output=True, text=True, timeout=300, env={**os.environ, **env})


def test_an_unbuildable_debian_base_fails_with_what_to_do(docker_client, unique_name):
    tag = f"{unique_name('unbuildable')}:test"
    build = _build("--base", "debian", "--tag", tag, DEBIAN_MIRROR="http://127.0.0.1:9/debian")
    assert build.returncode == 1
    if shutil.which("debootstrap"):
        assert "failed (above); set DEBIAN_MIRROR to a reachable Debian mirror, or pass --base IMAGE" in build.stderr
    else:
        assert "debootstrap is not installed: sudo apt-get install debootstrap (or pass --base IMAGE" in build.stderr
    assert not docker_client.images.list(name=tag.split(":")[0])


def test_a_base_without_python_fails_with_what_to_do(docker_client, busybox_image, unique_name):
    tag = f"{unique_name('no-python')}:test"
    build = _build("--base", busybox_image, "--tag", tag)
    assert build.returncode == 1
    assert f"base image {busybox_image} has no python3 3.11 with venv; pass --base IMAGE" in build.stderr
    assert not docker_client.images.list(name=tag.split(":")[0])
