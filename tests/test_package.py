import importlib
import subprocess
import sys

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
