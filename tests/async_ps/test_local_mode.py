"""AsyncPSStrategy(mode="local"): settings validated at construction, naming the setting."""

import logging

import pytest
import torch

from lightning_hetero.async_ps import AsyncPSStrategy, PSAdvanced
from lightning_hetero.local_sgd.round_plan import RoundBudget


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "diloco"}, r"mode must be one of \('bsp', 'asp', 'local'\), got 'diloco'"),
        ({"round_length": "0 samples"}, "round_length must be an integer >= 1, got 0"),
        ({"round_length": 0}, "round_length must be an integer >= 1, got 0"),
        ({"round_length": "0s"}, "round_length must be > 0"),
        ({"round_length": "nans"}, "round_length"),
        ({"round_length": "64 batches"}, "round_length must be local steps per rank"),
        ({"outer_optimizer": torch.optim.SGD, "outer_optimizer_kwargs": {"lr": 0.7, "betas": (0.9, 0.9)}}, "betas"),
        ({"outer_optimizer": torch.optim.Adam, "outer_optimizer_kwargs": {"lr": -1.0}}, "outer_optimizer=Adam"),
        ({"outer_optimizer": "sgd"}, "outer_optimizer must be a torch.optim.Optimizer class"),
        ({"on_worker_lost": "continue"}, r"mode='local'\) cannot honour on_worker_lost='continue'"),
    ],
)
def test_bad_local_settings_fail_at_construction_naming_the_setting(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AsyncPSStrategy(**{"mode": "local", **kwargs})


def test_local_settings_are_validated_whatever_the_starting_mode():
    # a SyncSwitchCallback may enter the local mode later: a bad setting must not wait until then
    with pytest.raises(ValueError, match="round_length"):
        AsyncPSStrategy(mode="bsp", round_length="0 samples")


def test_defaults_are_plain_averaging_and_speed_proportional_steps():
    strategy = AsyncPSStrategy(mode="local")
    assert strategy.mode == "local" and strategy.settings.advanced.local_steps == "proportional"
    assert strategy.settings.outer.description == "SGD(lr=1.0)"
    assert strategy.settings.advanced.pseudo_gradient_weighting == "mean"
    assert strategy.settings.round_budget == RoundBudget(steps=16)
    assert AsyncPSStrategy(mode="local", round_length="2.5s")._engines["local"].round_description() == "2.5 s"


def test_continue_is_accepted_when_local_sgd_is_only_switched_into():
    # the ASP phases of a schedule are elastic; a loss in a local phase ends the job (tests/async_ps/test_local_training.py)
    AsyncPSStrategy(mode="asp", on_worker_lost="continue").set_mode("local")


def test_set_mode_accepts_local_before_training():
    strategy = AsyncPSStrategy(mode="bsp")
    strategy.set_mode("local")
    assert strategy.mode == "local"
    with pytest.raises(ValueError, match="mode must be one of"):
        strategy.set_mode("sync")


def test_the_local_mode_is_announced_once_per_phase(caplog):
    knobs = PSAdvanced(pseudo_gradient_weighting="samples")
    strategy = AsyncPSStrategy(mode="local", round_length="256 samples", advanced=knobs)
    with caplog.at_level(logging.INFO):
        strategy._engines["local"].enter(switch=True)  # SyncSwitchCallback's switch at train start
        strategy._engines["local"].enter(switch=False)  # the strategy's own on_train_start
    announcements = [r.getMessage() for r in caplog.records if "local SGD, rounds of" in r.getMessage()]
    assert announcements == [
        "AsyncPSStrategy: local SGD, rounds of 256 samples, local_steps='proportional', "
        "pseudo_gradient_weighting='samples', outer optimizer SGD(lr=1.0)"
    ]
