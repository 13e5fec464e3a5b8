"""Shared test fixtures. Multi-process Lightning runs are launched as separate processes (see ``tests/helpers.py``)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from tests.helpers import read_json as read_json  # the old import path of the helper, kept for other branches
from tests.helpers import run_ranks as _run_ranks
from tests.helpers import run_script as _run_script

# The scripts are launched as processes, never imported by pytest (not even for --doctest-modules).
collect_ignore_glob = ["scripts/*"]


@pytest.fixture
def run_ranks() -> Callable[..., list[subprocess.CompletedProcess]]:
    return _run_ranks


@pytest.fixture
def run_script() -> Callable[..., subprocess.CompletedProcess]:
    return _run_script
