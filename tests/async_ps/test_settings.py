"""AsyncPSStrategy's public surface: a constructor a user can hold, the expert knobs in ``PSAdvanced`` (checked by
name), and the old keywords and attributes still served for one release with a ``DeprecationWarning``."""

import dataclasses
import inspect
import warnings

import pytest
from lightning.pytorch.strategies import DDPStrategy

from lightning_hetero.async_ps import AsyncPSStrategy, PSAdvanced
from lightning_hetero.async_ps.settings import DEFAULT_ROUND_LENGTH, PSSettings
from lightning_hetero.local_sgd.round_plan import RoundBudget

DDP_ARGUMENTS = {"accelerator", "parallel_devices", "cluster_environment", "checkpoint_io", "precision_plugin"}
DDP_ARGUMENTS |= {"process_group_backend"}


def own_parameters() -> list[str]:
    parameters = inspect.signature(AsyncPSStrategy).parameters.values()
    return [p.name for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD and p.name not in DDP_ARGUMENTS]


def test_the_strategy_takes_at_most_ten_parameters_of_its_own():
    assert len(own_parameters()) <= 10, own_parameters()
    assert DDP_ARGUMENTS.issubset(inspect.signature(DDPStrategy).parameters)  # the pass-through is DDP's own
    # the one catch-all serves the old keywords for one release, nothing else
    parameters = inspect.signature(AsyncPSStrategy).parameters.values()
    assert [p.name for p in parameters if p.kind is inspect.Parameter.VAR_KEYWORD] == ["deprecated"]


def test_the_settings_hold_the_strategys_arguments_in_their_order_and_its_defaults():
    # the strategy passes its arguments to PSSettings by position
    settings = [field for field in dataclasses.fields(PSSettings) if field.init]
    assert [field.name for field in settings] == own_parameters()
    defaults = inspect.signature(AsyncPSStrategy).parameters
    assert defaults["round_length"].default == DEFAULT_ROUND_LENGTH == PSSettings().round_length


@pytest.mark.parametrize(
    ("knobs", "match"),
    [
        ({"lr_scaling": "sqrt"}, "lr_scaling"),
        ({"startup_timeout_s": -1}, "startup_timeout_s must be > 0"),
        ({"local_steps": "auto"}, "local_steps must be one of"),
        ({"pseudo_gradient_weighting": "steps"}, "pseudo_gradient_weighting must be one of"),
        ({"overlap_round_trip": "yes"}, "overlap_round_trip must be True or False, got 'yes'"),
        ({"server_shards": 0}, "server_shards"),
        ({"server_shards": 2.0}, "server_shards"),
        ({"server_shards": "auto"}, r"server_shards=\.\.\.\) must be an integer >= 1, got 'auto'"),
        ({"server_placement": "auto"}, r"server_placement=\.\.\.\) must be one of \('worker', 'dedicated'\)"),
        ({"server_placement": "dedicated", "server_shards": 2}, r"does not support server_shards=2"),
    ],
)
def test_a_bad_expert_knob_fails_naming_it(knobs, match):
    with pytest.raises(ValueError, match=match):
        PSAdvanced(**knobs)


def test_advanced_must_be_the_expert_knobs():
    with pytest.raises(TypeError, match="advanced must be a PSAdvanced, got dict"):
        AsyncPSStrategy(advanced={"server_shards": 2})


def test_the_expert_knobs_take_effect():
    knobs = PSAdvanced(startup_timeout_s=12.0, local_steps="equal", pseudo_gradient_weighting="samples")
    strategy = AsyncPSStrategy(mode="local", advanced=knobs)
    assert strategy.settings.advanced is knobs
    assert strategy._timeout.total_seconds() == 12.0  # the process group's rendezvous
    local = strategy._engines["local"]
    assert (local.local_steps, local.pseudo_gradient_weighting) == ("equal", "samples")


@pytest.mark.parametrize(
    ("old", "budget", "new"),
    [
        ({"round_samples": 2048}, RoundBudget(samples=2048), "round_length='2048 samples'"),
        ({"round_s": 2.5}, RoundBudget(seconds=2.5), "round_length='2.5s'"),
    ],
)
def test_the_old_round_keywords_warn_and_still_set_the_round(old, budget, new):
    with pytest.deprecated_call(match=rf"AsyncPSStrategy\({next(iter(old))}=\.\.\.\) is deprecated .*{new}"):
        strategy = AsyncPSStrategy(mode="local", **old)
    assert strategy.settings.round_budget == budget


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("lr_scaling", "inverse"),
        ("startup_timeout_s", 10.0),
        ("local_steps", "equal"),
        ("pseudo_gradient_weighting", "samples"),
        ("overlap_round_trip", True),
        ("server_shards", 2),
        ("server_placement", "dedicated"),
    ],
)
def test_an_old_expert_keyword_warns_and_still_takes_effect(name, value):
    new = rf"use AsyncPSStrategy\(advanced=PSAdvanced\({name}=\.\.\.\)\)"
    with pytest.deprecated_call(match=rf"AsyncPSStrategy\({name}=\.\.\.\) is deprecated .*; {new}"):
        strategy = AsyncPSStrategy(**{name: value})
    assert getattr(strategy.settings.advanced, name) == value
    with pytest.deprecated_call(match=rf"AsyncPSStrategy.{name} is deprecated .*settings\.advanced\.{name}"):
        assert getattr(strategy, name) == value  # the former attribute, read where it now lives


def test_the_warning_points_at_the_line_that_builds_the_strategy():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        AsyncPSStrategy(round_s=1.0, server_shards=2)
    assert [warning.filename for warning in caught] == [__file__, __file__]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"round_samples": 64, "round_length": 8}, "give round_length only"),
        ({"round_samples": 64, "round_s": 1.0}, "give round_length only"),
        ({"server_shards": 2, "advanced": PSAdvanced()}, "give advanced only"),
        ({"round_sample": 64}, "unexpected keyword argument 'round_sample'"),
    ],
)
def test_an_old_keyword_with_its_new_place_or_an_unknown_one_is_refused(kwargs, error):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError, match=error):
            AsyncPSStrategy(**kwargs)
