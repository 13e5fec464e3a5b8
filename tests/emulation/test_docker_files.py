"""The files under docker/ agree with the emulator's defaults (test_docker_e2e.py builds the image)."""

import re
from pathlib import Path

import pytest
import yaml

from lightning_hetero.emulation.config import DEFAULT_CONTAINERS, load_config
from lightning_hetero.emulation.progress import PROGRESS_DIR_ENV

DOCKER = Path(__file__).parents[2] / "docker"


@pytest.mark.parametrize("variant", ["bsp", "asp"])
def test_compose_layout_matches_the_default_containers(variant):
    compose = yaml.safe_load((DOCKER / f"compose.{variant}.yaml").read_text())
    services = compose["services"]
    assert tuple(services) == DEFAULT_CONTAINERS[variant]
    for rank, (name, service) in enumerate(services.items()):
        assert service["container_name"] == name
        assert service["environment"]["NODE_RANK"] == str(rank)
        assert service["environment"]["NUM_NODES"] == str(len(services))
        assert service["environment"][PROGRESS_DIR_ENV] == "/progress"
        assert any(volume.endswith(":/progress") for volume in service["volumes"])


def test_dockerfile_copies_only_what_the_build_script_stages():
    sources = re.findall(r"^COPY (?!--from)(.+) \S+$", (DOCKER / "Dockerfile").read_text(), flags=re.MULTILINE)
    paths = {path for line in sources for path in line.split()}
    script = (DOCKER / "build-image.sh").read_text()
    assert "pip" in paths and 'mkdir -p "$ctx/pip/wheels"' in script
    (staged_tree,) = [line.split() for line in script.splitlines() if line.lstrip().startswith('tar -C "$ROOT"')]
    for path in paths - {"pip"}:
        assert (DOCKER.parent / path).exists(), path
        assert f'"$ROOT/{path}"' in script or path in staged_tree, path


def test_dockerfile_installs_the_examples_and_the_elastic_extra():
    # the emulated cluster's containers run the examples and elastic workers (torchft), on the CPU torch
    dockerfile = (DOCKER / "Dockerfile").read_text()
    pyproject = (DOCKER.parent / "pyproject.toml").read_text()
    installed = re.findall(r"extras\['(\w+)'\]", dockerfile)
    assert sorted(installed) == ["elastic", "examples"]
    for extra in installed:
        assert re.search(rf"^{extra} = \[", pyproject, flags=re.MULTILINE), extra
    assert re.search(r'^elastic = \["torchft', pyproject, flags=re.MULTILINE)
    assert "torch.version.cuda is None" in dockerfile


def test_example_config_is_valid():
    config = load_config(DOCKER / "emulate.example.yaml")
    assert config.schedule.level_at(15) == "HL8"
    assert "one_straggler" in config.levels
