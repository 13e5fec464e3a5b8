import importlib

import pytest
from lightning.pytorch.strategies import StrategyRegistry

import lightning_hetero
from lightning_hetero.async_ps import AsyncPSStrategy, PSAdvanced
from lightning_hetero.measurement import ComputeTimer


def test_registered_and_exported():
    assert "AsyncPSStrategy" in lightning_hetero.__all__
    assert StrategyRegistry["async_ps"]["strategy"] is AsyncPSStrategy


@pytest.mark.parametrize("old_module", ["lightning_hetero.ps", "lightning_hetero.ps.strategy"])
def test_the_old_import_paths_warn_and_serve_the_strategy(old_module):
    module = importlib.import_module(old_module)
    with pytest.warns(DeprecationWarning, match=f"{old_module}.AsyncPSStrategy is deprecated"):
        assert module.AsyncPSStrategy is AsyncPSStrategy


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "sync"}, "mode"),
        ({"max_staleness": -1}, "max_staleness"),
        ({"asynchrony_compensation": "on"}, "asynchrony_compensation must be one of"),
        ({"fault_timeout_s": 0}, "fault_timeout_s"),
        ({"on_worker_lost": "ignore"}, "on_worker_lost"),
        (
            {"advanced": PSAdvanced(server_shards=2), "on_worker_lost": "continue"},
            r"server_shards=2\) does not support",
        ),
        ({"advanced": PSAdvanced(server_placement="dedicated"), "on_worker_lost": "continue"}, "does not support"),
        # "auto"-style values where no automatic choice exists, or a misspelt one, fail at construction (issue 25)
        ({"asynchrony_compensation": "Auto"}, "asynchrony_compensation must be one of"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AsyncPSStrategy(**kwargs)


def test_asynchrony_compensation_is_on_by_default_and_settable():
    strategy = AsyncPSStrategy()
    assert strategy.asynchrony_compensation == "auto"
    strategy.asynchrony_compensation = None
    assert strategy.asynchrony_compensation is None
    with pytest.raises(ValueError, match="asynchrony_compensation"):
        strategy.asynchrony_compensation = "yes"
    assert AsyncPSStrategy(asynchrony_compensation="dc").asynchrony_compensation == "dc"


def test_set_mode_before_setup_just_records_it():
    strategy = AsyncPSStrategy()
    assert strategy.mode == "asp"
    strategy.set_mode("bsp")
    assert strategy.mode == "bsp" and strategy.last_switch_s is None
    with pytest.raises(ValueError, match="mode"):
        strategy.set_mode("hybrid")


def test_shares_default_to_equal_and_follow_attached_callable():
    strategy = AsyncPSStrategy()
    timer = ComputeTimer(clock=iter([1.0, 1.25]).__next__)
    strategy.attach_hetero_batches(timer, lambda: 0.75)
    assert strategy._weighting.share() == 0.75
    timer.start()
    strategy._weighting.mark_compute_end()
    assert timer.elapsed_s() == 0.25, "the strategy closed the attached timer's compute window"


def test_elastic_mode_refuses_hetero_batches_whose_split_assumes_fixed_ranks():
    strategy = AsyncPSStrategy(on_worker_lost="continue")
    with pytest.raises(ValueError, match="does not support HeteroBatchCallback"):
        strategy.attach_hetero_batches(ComputeTimer(), lambda: 0.5)


def test_the_settings_are_held_once_and_read_only():
    strategy = AsyncPSStrategy(max_staleness=3, round_length="30s", advanced=PSAdvanced(server_placement="dedicated"))
    assert (strategy.max_staleness, strategy.settings.advanced.server_placement) == (3, "dedicated")
    assert strategy.max_staleness is strategy.settings.max_staleness
    assert strategy.round_length == strategy.settings.round_length == "30s"
    with pytest.raises(AttributeError, match="read-only"):
        strategy.fault_timeout_s = 1.0
    with pytest.raises(AttributeError):
        strategy.settings.fault_timeout_s = 1.0
