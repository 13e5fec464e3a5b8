"""bench_sync_switch's pure parts: the reverse order's schedule and the --configs option."""

from __future__ import annotations

import argparse

import pytest
from benchmarks.scenarios import sync_switch as bench

from lightning_hetero.switching import FixedFractionPolicy
from lightning_hetero.switching.policies import SchedulePolicy, plan


@pytest.mark.parametrize("epochs", [1, 2, 4, 7, 12])
@pytest.mark.parametrize("fraction", [0.0, 0.05, 0.25, 0.5, 0.99, 1.0])
def test_reverse_runs_the_hybrids_phases_in_the_opposite_order(epochs, fraction):
    hybrid = plan(FixedFractionPolicy(fraction), max_epochs=epochs)
    reverse = plan(SchedulePolicy(bench.reverse_schedule(epochs, fraction)), max_epochs=epochs)
    assert reverse.count("bsp") == hybrid.count("bsp")
    assert reverse == sorted(hybrid)  # "asp" < "bsp": every ASP epoch first
    assert reverse == plan(FixedFractionPolicy(fraction, first="asp"), max_epochs=epochs)


def test_the_default_reverse_schedule():
    assert bench.reverse_schedule(12, 0.25) == "asp:0-8,bsp:9-"


def test_configs_keep_the_baseline_first_and_name_unknown_ones():
    assert bench.parse_configs("all") == list(bench.ALL)
    assert bench.parse_configs("asp_hetero, bsp") == ["bsp", "asp_hetero"]
    assert {"reverse", "asp_hetero"} <= set(bench.CONFIGS)
    with pytest.raises(argparse.ArgumentTypeError, match="ssp"):
        bench.parse_configs("bsp,ssp")
    with pytest.raises(argparse.ArgumentTypeError):
        bench.parse_configs(",")
