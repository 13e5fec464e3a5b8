"""scripts/bootstrap.sh finds the CPU torch wheel in pip's find-links, and scripts/cpu_torch.py names CUDA packages."""

from __future__ import annotations

import doctest
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.tags import sys_tags

REPO = Path(__file__).resolve().parents[1]
TAG = str(next(iter(sys_tags())))  # the most specific tag this interpreter installs
CPU_WHEEL = f"torch-2.13.0+cpu-{TAG}.whl"
DECOYS = (
    f"torch-2.14.1-{TAG}.whl",  # newer, but the CUDA build
    f"torch-2.12.0+cpu-{TAG}.whl",  # CPU, but older
    "torch-2.15.0+cpu-cp27-cp27m-win32.whl",  # CPU and newer, but not installable here
    f"torchvision-0.28.0+cpu-{TAG}.whl",
)


def print_cpu_wheel(tmp_path: Path, **pip_env: str) -> str:
    """``bootstrap.sh --print-cpu-wheel`` with pip's user and XDG config hidden and only ``pip_env`` for PIP_*."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CONFIG_DIRS=str(home / "xdg"),
        VENV=str(tmp_path / "no-venv"),  # so the script asks this interpreter's pip
        PYTHON=sys.executable,
        **pip_env,
    )
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "bootstrap.sh"), "--print-cpu-wheel"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return proc.stdout.strip()


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    """A find-links folder holding the CPU wheel (empty dummy files: only the names matter) and decoys."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    for name in (CPU_WHEEL, *DECOYS):
        (folder / name).touch()
    return folder


def write_pip_conf(tmp_path: Path, text: str) -> str:
    path = tmp_path / "pip.conf"
    path.write_text(text)
    return str(path)


def test_finds_the_cpu_wheel_in_a_config_files_find_links(tmp_path, wheels):
    conf = write_pip_conf(tmp_path, f"[global]\nfind-links = {wheels}\n")
    assert print_cpu_wheel(tmp_path, PIP_CONFIG_FILE=conf) == str(wheels / CPU_WHEEL)


def test_finds_it_among_several_entries_and_file_urls(tmp_path, wheels):
    empty = tmp_path / "empty"
    empty.mkdir()
    spaced = wheels.rename(tmp_path / "wheel house")  # pip splits on white space; a URL escapes it
    conf = write_pip_conf(
        tmp_path,
        f"[install]\nfind-links =\n    https://example.invalid/wheels\n    {empty.as_uri()} {spaced.as_uri()}\n",
    )
    assert print_cpu_wheel(tmp_path, PIP_CONFIG_FILE=conf) == str(spaced / CPU_WHEEL)


def test_finds_it_through_the_environment_variable(tmp_path, wheels):
    found = print_cpu_wheel(tmp_path, PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS=f"{tmp_path} {wheels.as_uri()}")
    assert found == str(wheels / CPU_WHEEL)


def test_finds_nothing_without_a_cpu_wheel(tmp_path, wheels):
    (wheels / CPU_WHEEL).unlink()
    (wheels / DECOYS[1]).unlink()  # only the CUDA build, an uninstallable CPU build and torchvision are left
    conf = write_pip_conf(tmp_path, f"[global]\nfind-links = {wheels}\n")
    assert print_cpu_wheel(tmp_path, PIP_CONFIG_FILE=conf) == ""
    assert print_cpu_wheel(tmp_path, PIP_CONFIG_FILE=os.devnull) == ""


def run_check(site: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "cpu_torch.py"), "check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_passes_in_the_test_environment():
    proc = run_check()
    assert proc.returncode == 0, proc.stderr


def test_check_names_a_cuda_torch_and_nvidia_packages(tmp_path):
    site = tmp_path / "site"
    for name, version in (("nvidia_cublas_cu12", "12.8.4.1"), ("torch", "2.14.1")):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_text("from typing import Optional\ncuda: Optional[str] = '12.8'\n")
    proc = run_check(site)
    assert proc.returncode == 1
    assert "nvidia-cublas-cu12 12.8.4.1" in proc.stderr
    assert "torch 2.14.1 (built for CUDA 12.8)" in proc.stderr


def test_docstring_examples_pass():
    spec = importlib.util.spec_from_file_location("cpu_torch", REPO / "scripts" / "cpu_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
