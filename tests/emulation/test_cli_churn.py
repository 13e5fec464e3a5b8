"""``lightning-hetero cluster stop|start|churn`` with the Docker backend replaced by a recorder."""

import pytest

from lightning_hetero.emulation import cli
from lightning_hetero.emulation.docker_backend import DockerBackend


class FakeContainer:
    def __init__(self, name: str, calls: list) -> None:
        self.name, self.calls = name, calls

    def kill(self) -> None:
        self.calls.append(("kill", self.name))

    def start(self) -> None:
        self.calls.append(("start", self.name))


class FakeContainers:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def get(self, name: str) -> FakeContainer:
        return FakeContainer(name, self.calls)


class FakeClient:
    def __init__(self) -> None:
        self.calls: list = []
        self.containers = FakeContainers(self.calls)


@pytest.fixture
def docker(monkeypatch):
    client = FakeClient()
    monkeypatch.setattr(cli, "_connect", lambda args: DockerBackend(client))
    slept = []
    monkeypatch.setattr(cli.time, "sleep", slept.append)
    return client


def test_stop_and_start_kill_and_start_the_named_containers(docker):
    assert cli.main(["cluster", "stop", "--workers", "worker2,worker3"]) == 0
    assert cli.main(["cluster", "start", "--workers", "worker2"]) == 0
    assert docker.calls == [("kill", "worker2"), ("kill", "worker3"), ("start", "worker2")]


def test_churn_follows_the_plan(docker):
    assert (
        cli.main(["cluster", "churn", "--workers", "worker4", "--every-s", "10", "--down-s", "2", "--cycles", "3"]) == 0
    )
    assert docker.calls == [("kill", "worker4"), ("start", "worker4")] * 3


def test_churn_dry_run_prints_the_plan_and_touches_nothing(docker, capsys):
    assert cli.main(["cluster", "churn", "--dry-run", "--workers", "w2", "--every-s", "30", "--cycles", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "at 30 s: stop w2", "at 35 s: start w2", "at 60 s: stop w2", "at 65 s: start w2",
    ]  # fmt: skip
    assert docker.calls == []


def test_a_bad_churn_is_refused_naming_the_setting(docker, capsys):
    assert cli.main(["cluster", "churn", "--workers", "w2", "--every-s", "5", "--down-s", "6"]) == cli.EXIT_USAGE
    assert "down_s=6 must be shorter than every_s=5" in capsys.readouterr().err
