"""The examples' docstring examples run (pytest's doctest collection covers only ``src/``)."""

import doctest
from types import ModuleType

import pytest
from examples.char_gpt import data as char_data
from examples.char_gpt import model as char_model
from examples.image_classification import data as image_data
from examples.image_classification import model as image_model

from examples import demo


@pytest.mark.parametrize("module", [image_model, image_data, char_model, char_data, demo], ids=lambda m: m.__name__)
def test_docstring_examples_pass(module: ModuleType):
    result = doctest.testmod(module)
    assert result.attempted > 0
    assert result.failed == 0
