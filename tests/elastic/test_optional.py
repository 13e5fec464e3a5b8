"""Without the ``[elastic]`` extra nothing changes: with torchft made unimportable, every module but the elastic ones
imports (so none imports torchft) and the package's names work; only the elastic strategy asks for the extra."""

import subprocess
import sys

SCRIPT = """
import importlib, pathlib, sys
sys.modules["torchft"] = None  # what an interpreter without the extra sees: import torchft fails
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
print(len(names), sorted(m for m in sys.modules if m.startswith("lightning_hetero.elastic")))
lightning_hetero.AsyncPSStrategy(mode="local")
import lightning_hetero.elastic as elastic
try:
    elastic.ElasticLocalSGDStrategy(lighthouse="http://localhost:1")
except ImportError as err:
    print("refused:", err)
"""


def test_without_torchft_every_other_module_imports_and_the_strategy_names_the_extra():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout
    count, elastic_modules = out.splitlines()[0].split(" ", 1)
    assert int(count) > 50 and elastic_modules == "[]"
    assert "refused: ElasticLocalSGDStrategy needs torchft: pip install 'lightning-hetero[elastic]'" in out
