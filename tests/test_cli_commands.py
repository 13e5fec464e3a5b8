"""The `lightning-hetero` command (``lightning_hetero.emulation.cli``): `emulate` and `cluster` dry runs, errors, help."""

import subprocess
import sys
import textwrap

import pytest

from lightning_hetero.emulation.cli import main


def test_static_dry_run_prints_the_plan(capsys):
    assert main(["emulate", "--dry-run", "level=HL4", "host_cpus=2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "dry run: 2 host CPUs (from the config); nothing is changed"
    assert out[1] == "HL4 (static):"
    assert out[4] == "  worker3: cpuset_cpus=0-1 cpu_quota=25000 cpu_period=100000"


def test_dynamic_dry_run_lists_every_transition(capsys, tmp_path):
    config = tmp_path / "emulate.yaml"
    config.write_text("variant: asp\nschedule: omnilearn-resnet18\nhost_cpus: 48\n")
    assert main(["emulate", "--dry-run", "-c", str(config)]) == 0
    out = capsys.readouterr().out
    assert out.count(":\n  aspworker1:") == 7
    assert "epoch 15: HL8:\n  aspworker1: cpuset_cpus=0-7 cpu_quota=-1" in out
    assert "  aspworker5: cpuset_cpus=20-47 cpu_quota=-1 cpu_period=100000" in out


def test_cluster_dry_runs(capsys):
    assert main(["cluster", "up", "--dry-run", "level=HL1", "host_cpus=4"]) == 0
    out = capsys.readouterr().out
    assert "would create network lightning-hetero and, from image lightning-hetero-worker:latest:" in out
    assert "  worker4: cpuset_cpus=0-3 cpu_quota=100000 cpu_period=100000 (NODE_RANK=3," in out
    assert main(["cluster", "down", "--dry-run"]) == 0
    assert "would remove containers worker1, worker2, worker3, worker4" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["emulate", "--dry-run"], "level: emulate needs level=<name>"),
        (["emulate", "--dry-run", "level=HL3"], "level: unknown level 'HL3'"),
        (["emulate", "--dry-run", "level=HL2", "lvl=3"], "lvl: unknown key"),
        (["emulate", "--dry-run", "levels.x=['0','1','2','7']", "level=x", "host_cpus=4"], "beyond the host's 4"),
        (
            ["emulate", "--dry-run", "level=HL4", "allocation=cpuset", "host_cpus=2"],
            "the host has 2 cores; use allocation=quota",
        ),
        (
            ["emulate", "--dry-run", "schedule=omnilearn-resnet18", "schedule.unit=seconds"],
            "schedule.unit: schedule 'omnilearn-resnet18' is a named schedule, by epoch",
        ),
    ],
)
def test_configuration_errors_exit_2_naming_the_key(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_unreachable_daemon_is_a_clear_error(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    assert main(["emulate", "level=HL1"]) == 1
    assert f"cannot reach the Docker daemon at unix://{tmp_path}/no-docker.sock" in capsys.readouterr().err


def test_dry_run_and_help_import_neither_docker_nor_lightning():
    # the host companion starts in well under a second: no Docker SDK, Lightning or torch until it needs them
    code = textwrap.dedent(
        """
        import contextlib, sys
        from lightning_hetero.emulation.cli import main
        main(["emulate", "--dry-run", "level=HL2"])
        with contextlib.suppress(SystemExit):
            main(["--help"])
        print(sorted(m for m in ("docker", "lightning", "torch") if m in sys.modules))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "[]"


def test_named_schedule_still_overrides_a_seconds_schedule(capsys):
    assert main(["emulate", "--dry-run", "schedule.unit=seconds", "schedule=omnilearn-resnet18", "host_cpus=48"]) == 0
    assert "epoch 15: HL8:" in capsys.readouterr().out


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "emulate" in out and "cluster" in out
    assert "variant=bsp (worker1-4)                HL1 12,12,12,12  HL2 12,12,8,16  HL4 9,9,6,24  HL8 6,6,4,32" in out
    assert "omnilearn-resnet18   0: HL1  5: HL2  10: HL4  15: HL8" in out


def test_dry_run_into_a_closed_pipe_exits_cleanly():
    script = (
        f"{sys.executable} -m lightning_hetero.emulation.cli emulate --dry-run schedule=omnilearn-resnet18 | head -n 1"
    )
    result = subprocess.run(["bash", "-o", "pipefail", "-c", script], capture_output=True, text=True, timeout=120)
    assert result.stdout.startswith("dry run:") and result.stdout.count("\n") == 1
    assert result.returncode == 0 and result.stderr == "", result.stderr
