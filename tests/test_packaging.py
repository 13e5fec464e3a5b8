"""The distributions a package index would get: they build, pass ``twine check``, and carry what they should."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")


def relative_links(markdown: str) -> list[str]:
    """Link targets that would break where the text is shown away from the repository (a package index)."""
    return [target for target in MARKDOWN_LINK.findall(markdown) if not re.match(r"(https?://|mailto:|#)", target)]


def test_readme_links_are_absolute():
    assert relative_links((REPO / "README.md").read_text()) == []


def test_relative_links_are_found():
    text = "[a](docs/a.md) [b](https://example.org/b) [c](#usage) ![d](img/d.png)"
    assert relative_links(text) == ["docs/a.md", "img/d.png"]


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return {"sdist": next(out.glob("*.tar.gz")), "wheel": next(out.glob("*.whl"))}


def test_twine_check_passes(dists):
    proc = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(dists["sdist"]), str(dists["wheel"])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_wheel_holds_the_typed_package_only(dists):
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        names = wheel.namelist()
        metadata_name = next(name for name in names if name.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(wheel.read(metadata_name).decode())
    assert "lightning_hetero/py.typed" in names
    assert {name.split("/")[0].split("-")[0] for name in names} == {"lightning_hetero"}
    urls = {url.split(",")[0] for url in metadata.get_all("Project-URL")}
    assert {"Documentation", "Changelog", "Issues", "Source"} <= urls
    assert relative_links(metadata.get_payload()) == []


def test_sdist_carries_the_examples_docs_and_changelog(dists):
    with tarfile.open(dists["sdist"]) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {
        "examples/demo.py",
        "examples/image_classification/train.py",
        "docs/hetero_batch.md",
        "CHANGELOG.md",
    } <= names
    assert not any("__pycache__" in name for name in names)
