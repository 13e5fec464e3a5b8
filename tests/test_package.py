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
    assert len(lightning_hetero.__all__) <= 12  # the user-facing classes and policies only
    for name in lightning_hetero.__all__:
        value = getattr(lightning_hetero, name)
        assert value.__name__ == name
        assert value.__module__.startswith(lightning_hetero._MODULES[name]), (name, value.__module__)
    importlib.reload(lightning_hetero)


def run_python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_import_alone_loads_no_lightning():
    assert run_python("import sys, lightning_hetero; print('lightning' in sys.modules)") == "False"


@pytest.mark.parametrize(
    "imports",
    [
        "import lightning, lightning_hetero",
        "import lightning_hetero, lightning",
        "import lightning_hetero; import lightning.pytorch as pl",
        "from lightning_hetero import HeteroBatchCallback",
        # modules of the strategy's that import Lightning themselves, half-way through the package's import
        "import lightning_hetero.async_ps.runtime.sampler",
        "from lightning_hetero.async_ps.engines.asp import AsynchronousEngine",
    ],
)
def test_async_ps_is_registered_whatever_the_import_order(imports):
    registered = "from lightning.pytorch.strategies import StrategyRegistry; print('async_ps' in StrategyRegistry)"
    assert run_python(f"{imports}; {registered}") == "True"


@pytest.mark.parametrize("first", ["import lightning_hetero", "import lightning_hetero.async_ps.runtime.sampler"])
def test_a_trainer_resolves_async_ps_when_the_package_is_imported_first(first):
    code = (
        f"{first}; import lightning as L; "
        "t = L.Trainer(strategy='async_ps', accelerator='cpu', devices=1, logger=False, enable_progress_bar=False); "
        "print(type(t.strategy).__name__)"
    )
    assert run_python(code) == "AsyncPSStrategy"


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchCallback'"):
        lightning_hetero.NoSuchCallback


def test_every_callback_hook_in_the_package_is_marked_override():
    from lightning.pytorch.callbacks import Callback

    from lightning_hetero.emulation.reporter import ProgressReporter
    from lightning_hetero.emulation.slowdown import SlowdownEmulator
    from lightning_hetero.hetero_batch import HeteroBatchCallback
    from lightning_hetero.switching import SyncSwitchCallback

    hooks = {name for name in vars(Callback) if not name.startswith("__")}
    for callback in (HeteroBatchCallback, SlowdownEmulator, ProgressReporter, SyncSwitchCallback):
        overridden = hooks & set(vars(callback))
        assert overridden, callback
        unmarked = sorted(name for name in overridden if not getattr(vars(callback)[name], "__override__", False))
        assert unmarked == [], f"{callback.__name__}: hooks without @override: {unmarked}"


@pytest.mark.parametrize("name", sorted(lightning_hetero._MOVED))
def test_internals_once_exported_still_import_for_a_release_with_a_warning(name):
    with pytest.warns(DeprecationWarning, match=f"lightning_hetero.{name} is deprecated"):
        value = getattr(lightning_hetero, name)
    assert value is getattr(importlib.import_module(lightning_hetero._MOVED[name]), name)
    assert name not in lightning_hetero.__all__
