"""HeteroBatch keeps the shape it was given: few modules, a thin callback, a constructor a user can hold."""

import dataclasses
import inspect
from pathlib import Path

import lightning_hetero.hetero_batch as package
from lightning_hetero.hetero_batch import HeteroBatchCallback, HeteroBatchSettings

PACKAGE = Path(package.__file__).parent


def test_at_most_twelve_modules():
    modules = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(modules) <= 12, modules


def test_the_callback_is_at_most_250_lines():
    lines = (PACKAGE / "callback.py").read_text().splitlines()
    assert len(lines) <= 250, f"callback.py has {len(lines)} lines"


def test_the_callback_takes_at_most_ten_parameters():
    parameters = inspect.signature(HeteroBatchCallback).parameters.values()
    named = [p.name for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD]
    assert len(named) <= 10, named
    # the one catch-all serves the old keywords for one release (tests/hetero_batch/test_callback.py), nothing else
    assert [p.name for p in parameters if p.kind is inspect.Parameter.VAR_KEYWORD] == ["deprecated"]


def test_the_settings_hold_the_callbacks_arguments_in_their_order():
    # the callback passes its arguments to HeteroBatchSettings by position
    parameters = inspect.signature(HeteroBatchCallback).parameters.values()
    named = [p.name for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD]
    assert [field.name for field in dataclasses.fields(HeteroBatchSettings)] == named
