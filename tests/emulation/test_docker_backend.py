"""Integration tests against a real Docker daemon (see conftest.py for when they skip or fail)."""

import pytest

from lightning_hetero.emulation.cli import main
from lightning_hetero.emulation.config import load_config
from lightning_hetero.emulation.docker_backend import DockerBackend, DockerBackendError
from lightning_hetero.emulation.plan import ContainerUpdate
from lightning_hetero.emulation.runner import plan_levels, run_dynamic

pytestmark = pytest.mark.docker

# A fixed CPU-bound loop timed inside the container with /proc/uptime (centiseconds).
TIMED_LOOP = (
    "read a _ < /proc/uptime; i=0; while [ $i -lt 150000 ]; do i=$((i+1)); done; read b _ < /proc/uptime; echo $a $b"
)


def _limits(docker_client, name):
    host_config = docker_client.containers.get(name).attrs["HostConfig"]
    return host_config["CpusetCpus"], host_config["CpuQuota"], host_config["CpuPeriod"]


def _loop_seconds(container):
    result = container.exec_run(["/bin/sh", "-c", TIMED_LOOP])
    assert result.exit_code == 0, result.output
    start, end = map(float, result.output.split())
    return end - start


def test_static_level_sets_cpuset_and_quota(docker_client, make_containers):
    names = make_containers(2)
    host_cpus = docker_client.info()["NCPU"]
    overrides = [f"containers=[{names[0]},{names[1]}]", "levels.mine=['0', 0.5]", "level=mine"]
    assert main(["emulate", *overrides]) == 0
    all_cores = f"0-{host_cpus - 1}" if host_cpus > 1 else "0"
    assert _limits(docker_client, names[0]) == ("0", -1, 100_000)
    assert _limits(docker_client, names[1]) == (all_cores, 50_000, 100_000)


def test_missing_container_changes_nothing(docker_client, make_containers, capsys):
    (name,) = make_containers(1)
    before = _limits(docker_client, name)
    overrides = [f"containers=[{name},lh-test-no-such-container]", "levels.mine=[0.5, 0.5]", "level=mine"]
    assert main(["emulate", *overrides]) == 1
    assert "containers not found: lh-test-no-such-container; nothing was changed" in capsys.readouterr().err
    assert _limits(docker_client, name) == before


def test_cpuset_beyond_the_host_changes_nothing(docker_client, make_containers, capsys):
    names = make_containers(2)
    host_cpus = docker_client.info()["NCPU"]
    before = [_limits(docker_client, name) for name in names]
    overrides = [f"containers=[{names[0]},{names[1]}]", f"levels.mine=['0', '{host_cpus}']", "level=mine"]
    assert main(["emulate", *overrides]) == 2
    assert f"names cores [{host_cpus}] beyond the host's {host_cpus}" in capsys.readouterr().err
    assert [_limits(docker_client, name) for name in names] == before


def test_refused_update_restores_the_containers_already_updated(docker_client, make_containers):
    names = make_containers(2)
    backend = DockerBackend(docker_client)
    backend.apply([ContainerUpdate(names[0], "0", 30_000, 100_000)], reason="before")
    updates = [ContainerUpdate(names[0], "0", 50_000, 100_000), ContainerUpdate(names[1], "0", 50_000, 10)]
    with pytest.raises(DockerBackendError, match=f"{names[1]}: Docker refused .* restored 1 container"):
        backend.apply(updates, reason="test")
    assert _limits(docker_client, names[0]) == ("0", 30_000, 100_000)


def test_shrinking_the_quota_slows_a_cpu_bound_loop(docker_client, make_containers):
    (name,) = make_containers(1)
    container = docker_client.containers.get(name)
    backend = DockerBackend(docker_client)
    backend.apply([ContainerUpdate(name, "0", 100_000, 100_000)], reason="one CPU")
    full_s = _loop_seconds(container)
    backend.apply([ContainerUpdate(name, "0", 10_000, 100_000)], reason="a tenth of a CPU")
    throttled_s = _loop_seconds(container)
    # 10x in theory; on a busy shared host the unthrottled loop gets only its fair share of the core
    assert throttled_s > 2 * full_s, (full_s, throttled_s)


def test_dynamic_wall_clock_schedule_ends_at_the_last_level(docker_client, make_containers, caplog):
    names = make_containers(4)
    config = load_config(
        overrides=[
            f"containers=[{','.join(names)}]",
            "schedule.unit=seconds",
            "schedule.steps=[{start: 0, level: HL1}, {start: 0.5, level: HL8}]",
            "poll_interval_s=0.1",
            "allocation=quota",
        ]
    )
    backend = DockerBackend(docker_client)
    with caplog.at_level("INFO", logger="lightning_hetero.emulation"):
        run_dynamic(config, backend)
    quotas = [_limits(docker_client, name)[1] for name in names]
    assert quotas == [update.cpu_quota for update in plan_levels(config, backend.host_cpus())["HL8"]]
    assert any("HL8 at seconds" in message for message in caplog.messages)


def test_cluster_up_and_down(docker_client, busybox_image, unique_name, tmp_path):
    names = [unique_name(f"w{i}") for i in range(4)]
    overrides = [
        f"containers=[{','.join(names)}]",
        f"cluster.image={busybox_image}",
        "cluster.command=[/bin/sleep,3600]",
        f"cluster.network={unique_name('net')}",
        f"progress_dir={tmp_path}",
        "level=HL2",
        "allocation=quota",
    ]
    try:
        assert main(["cluster", "up", *overrides]) == 0
        container = docker_client.containers.get(names[3])
        assert "LIGHTNING_HETERO_PROGRESS_DIR=/progress" in container.attrs["Config"]["Env"]
        assert "NODE_RANK=3" in container.attrs["Config"]["Env"]
        assert {m["Destination"]: m["Source"] for m in container.attrs["Mounts"]}["/progress"] == str(tmp_path)
        assert container.attrs["HostConfig"]["CpuQuota"] > _limits(docker_client, names[0])[1] > 0
        assert main(["cluster", "up", *overrides]) == 1  # already exists: refused, nothing created twice
    finally:
        assert main(["cluster", "down", *overrides]) == 0
    assert not docker_client.containers.list(all=True, filters={"name": names[0]})


def test_unreachable_daemon_says_what_to_do():
    with pytest.raises(DockerBackendError, match=r"cannot reach the Docker daemon at tcp://127.0.0.1:9.*start it"):
        DockerBackend.connect("tcp://127.0.0.1:9", timeout_s=2)


def test_missing_image_creates_nothing(docker_client, unique_name, tmp_path, capsys):
    names, network = [unique_name("w0"), unique_name("w1")], unique_name("net")
    overrides = [
        f"containers=[{names[0]},{names[1]}]",
        f"cluster.image={unique_name('no-such-image')}:latest",
        f"cluster.network={network}",
        f"progress_dir={tmp_path}",
    ]
    assert main(["cluster", "up", *overrides]) == 1
    assert "build it with `docker/build-image.sh --tag" in capsys.readouterr().err
    assert not docker_client.containers.list(all=True, filters={"name": names[0]})
    assert not docker_client.networks.list(names=[network])
