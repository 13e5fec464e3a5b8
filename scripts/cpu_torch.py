"""Find the CPU torch wheel pip is configured to see, and check that an environment holds no CUDA build.

Used by ``scripts/bootstrap.sh``; run it with the Python of the environment in question (the wheel must match that
interpreter's tags, and pip's configuration is read through that interpreter's pip)::

    python scripts/cpu_torch.py wheel   # print the newest compatible torch-*+cpu wheel in pip's find-links, or nothing
    python scripts/cpu_torch.py check   # exit 1, naming the packages, if a CUDA torch or nvidia-* package is installed

Find-links come from pip's configuration (``pip config list``: the ``global`` and ``install`` sections of every
config file pip reads, and ``PIP_FIND_LINKS``); an entry may be a folder, a ``file://`` URL or a wheel's path, and a
setting may hold several entries separated by white space (as pip splits them). Remote URLs are skipped.
"""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

try:
    from packaging.tags import sys_tags
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename
except ImportError:  # a bare venv has no packaging, but its pip always vendors one
    from pip._vendor.packaging.tags import sys_tags
    from pip._vendor.packaging.utils import InvalidWheelFilename, parse_wheel_filename

FIND_LINKS_KEYS = ("global.find-links", "install.find-links", ":env:.find-links")


def find_links() -> list[str]:
    """The find-links entries of pip's configuration, in the order pip lists them."""
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "config", "list"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    entries: list[str] = []
    for line in listing.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in FIND_LINKS_KEYS:
            entries.extend(ast.literal_eval(value).split())
    return entries


def local_path(entry: str) -> Path | None:
    """The file-system path of a find-links entry, or ``None`` for a remote URL.

    >>> local_path("file:///opt/wheels"), local_path("/opt/wheels"), local_path("https://example.org/wheels")
    (PosixPath('/opt/wheels'), PosixPath('/opt/wheels'), None)
    """
    url = urlparse(entry)
    if url.scheme == "file":
        return Path(unquote(url.path))
    if url.scheme and len(url.scheme) > 1:  # a one-letter scheme is a Windows drive
        return None
    return Path(entry)


def cpu_torch_wheel(entries: list[str]) -> Path | None:
    """The newest ``torch-*+cpu`` wheel among ``entries`` that this interpreter can install, or ``None``."""
    supported = set(sys_tags())
    candidates = []
    for entry in entries:
        path = local_path(entry)
        if path is None:
            continue
        files = sorted(path.glob("torch-*.whl")) if path.is_dir() else [path]
        for wheel in files:
            try:
                name, version, _, tags = parse_wheel_filename(wheel.name)
            except InvalidWheelFilename:
                continue
            if name == "torch" and version.local == "cpu" and supported & set(tags):
                candidates.append((version, wheel))
    return max(candidates)[1] if candidates else None


def torch_cuda_version(dist: importlib.metadata.Distribution) -> str | None:
    """The ``torch.version.cuda`` of an installed torch, read from its ``version.py`` without importing torch."""
    source = Path(str(dist.locate_file("torch/version.py"))).read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        elif isinstance(node, ast.Assign):
            targets = node.targets
        else:
            continue
        if any(isinstance(target, ast.Name) and target.id == "cuda" for target in targets):
            return ast.literal_eval(node.value)
    return None


def cuda_packages() -> list[str]:
    """Installed distributions that make this a CUDA environment: ``nvidia-*`` packages and a CUDA torch."""
    found = []
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"].lower().replace("_", "-")
        if name.startswith("nvidia-"):
            found.append(f"{name} {dist.version}")
        elif name == "torch" and (cuda := torch_cuda_version(dist)) is not None:
            found.append(f"torch {dist.version} (built for CUDA {cuda})")
    return sorted(found)


def main(argv: list[str]) -> int:
    if argv == ["wheel"]:
        wheel = cpu_torch_wheel(find_links())
        if wheel is not None:
            print(wheel)
        return 0
    if argv == ["check"]:
        found = cuda_packages()
        if found:
            print(
                f"{sys.prefix} holds CUDA packages: {', '.join(found)}.\n"
                "The tests run on CPU; a CUDA torch means pip resolved torch from an index instead of the CPU wheel "
                "(scripts/bootstrap.sh installs torch-*+cpu from pip's find-links first). "
                "Remove the environment and run `make venv` again.",
                file=sys.stderr,
            )
            return 1
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
