"""Without the ``[elastic]`` extra nothing changes: no module but the elastic ones imports torchft, and with torchft
absent the package imports and only the elastic strategy asks for the extra."""

import subprocess
import sys

SCRIPT_ALL_BUT_ELASTIC = """
import importlib, pathlib, sys
import lightning_hetero
root = pathlib.Path(lightning_hetero.__file__).parent
files = [p.relative_to(root.parent).with_suffix("") for p in root.rglob("*.py")]
names = [".".join(f.parts[:-1] if f.name == "__init__" else f.parts) for f in files]
for name in names:
    if not name.startswith("lightning_hetero.elastic"):
        importlib.import_module(name)
for name in lightning_hetero.__all__:
    if name != "ElasticLocalSGDStrategy":
        getattr(lightning_hetero, name)
print(len(names), "torchft" in sys.modules, sorted(m for m in sys.modules if m.startswith("lightning_hetero.elastic")))
"""

SCRIPT_TORCHFT_BLOCKED = """
import sys
sys.modules["torchft"] = None  # what an interpreter without the extra sees: import torchft fails
import lightning_hetero
from lightning_hetero import AsyncPSStrategy
AsyncPSStrategy(mode="local")
import lightning_hetero.elastic as elastic
try:
    elastic.ElasticLocalSGDStrategy(lighthouse="http://localhost:1")
except ImportError as err:
    print("refused:", err)
"""


def _run(script: str) -> str:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout


def test_no_module_outside_the_elastic_package_imports_torchft():
    count, torchft, elastic = _run(SCRIPT_ALL_BUT_ELASTIC).split(" ", 2)
    assert int(count) > 50
    assert torchft == "False" and elastic.strip() == "[]"


def test_the_package_works_without_torchft_and_the_strategy_names_the_extra():
    assert "refused: ElasticLocalSGDStrategy needs torchft: pip install 'lightning-hetero[elastic]'" in _run(
        SCRIPT_TORCHFT_BLOCKED
    )
