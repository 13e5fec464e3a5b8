import importlib
import subprocess
import sys

import pytest

import lightning_hetero


def test_version_is_exposed():
    assert isinstance(lightning_hetero.__version__, str)
    assert lightning_hetero.__version__.count(".") >= 2


def test_import_does_not_pull_torchvision_or_docker():
    code = "import sys, lightning_hetero; print(sorted(m for m in ('torchvision', 'docker') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_public_names_resolve():
    for name in lightning_hetero.__all__:
        assert getattr(lightning_hetero, name) is not None
    importlib.reload(lightning_hetero)


def run_python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_import_alone_loads_no_lightning():
    assert run_python("import sys, lightning_hetero; print('lightning' in sys.modules)") == "False"


def test_async_ps_is_registered_after_lightning_or_on_first_use():
    registered = "from lightning.pytorch.strategies import StrategyRegistry; print('async_ps' in StrategyRegistry)"
    assert run_python(f"import lightning, lightning_hetero; {registered}") == "True"
    assert run_python(f"from lightning_hetero import HeteroBatchCallback; {registered}") == "True"


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchCallback'"):
        lightning_hetero.NoSuchCallback
