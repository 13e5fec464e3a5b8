"""The elastic strategies' public surface: constructors a user can hold, the expert knobs in
``ElasticLocalSGDAdvanced`` and ``ElasticHeteroBatchAdvanced`` (checked by name), and the old keywords and attributes
served for one release with a ``DeprecationWarning``."""

import inspect
import warnings

import pytest

from lightning_hetero.elastic import (
    ElasticHeteroBatchAdvanced,
    ElasticHeteroBatchStrategy,
    ElasticLocalSGDAdvanced,
    ElasticLocalSGDStrategy,
)

LIGHTHOUSE = "http://node0:29510"


@pytest.mark.parametrize("strategy", [ElasticLocalSGDStrategy, ElasticHeteroBatchStrategy])
def test_the_strategy_takes_at_most_ten_parameters_of_its_own(strategy):
    parameters = inspect.signature(strategy).parameters.values()
    named = [p.name for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD]
    assert len(named) <= 10, named
    # the catch-all is SingleDeviceStrategy's (and serves the old keywords for one release)
    assert [p.name for p in parameters if p.kind is inspect.Parameter.VAR_KEYWORD] == ["kwargs"]


@pytest.mark.parametrize(
    ("knobs", "match"),
    [
        ({"pseudo_gradient_weighting": "median"}, "pseudo_gradient_weighting must be one of"),
        ({"startup_timeout_s": 0}, "startup_timeout_s must be > 0, got 0"),
        ({"join_timeout_s": -1.0}, "join_timeout_s must be > 0"),
        ({"heartbeat_timeout_s": float("nan")}, "heartbeat_timeout_s"),
    ],
)
def test_a_bad_expert_knob_fails_naming_it(knobs, match):
    with pytest.raises(ValueError, match=match):
        ElasticLocalSGDAdvanced(**knobs)


def test_the_expert_knobs_take_effect():
    knobs = ElasticLocalSGDAdvanced(startup_timeout_s=3.0, join_timeout_s=7.0, heartbeat_timeout_s=1.5)
    strategy = ElasticLocalSGDStrategy(lighthouse=LIGHTHOUSE, round_length=8, advanced=knobs)
    connection = strategy.connection
    assert (connection.startup_timeout_s, connection.join_timeout_s, connection.heartbeat_timeout_s) == (3.0, 7.0, 1.5)
    assert strategy.advanced is knobs and strategy.round_length == 8
    with pytest.raises(TypeError, match="advanced must be an ElasticLocalSGDAdvanced, got dict"):
        ElasticLocalSGDStrategy(lighthouse=LIGHTHOUSE, advanced={"join_timeout_s": 7.0})


def test_steps_per_round_warns_and_still_sets_the_round_length():
    with pytest.deprecated_call(
        match=r"steps_per_round=\.\.\.\) is deprecated .*; use ElasticLocalSGDStrategy\(round_length"
    ):
        strategy = ElasticLocalSGDStrategy(lighthouse=LIGHTHOUSE, steps_per_round=4)
    assert strategy.round_length == 4
    with pytest.deprecated_call(match=r"ElasticLocalSGDStrategy.steps_per_round is deprecated .*\.round_length"):
        assert strategy.steps_per_round == 4


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("pseudo_gradient_weighting", "samples"),
        ("startup_timeout_s", 3.0),
        ("join_timeout_s", 7.0),
        ("heartbeat_timeout_s", 1.5),
    ],
)
def test_an_old_expert_keyword_warns_and_still_takes_effect(name, value):
    new = rf"use ElasticLocalSGDStrategy\(advanced=ElasticLocalSGDAdvanced\({name}=\.\.\.\)\)"
    with pytest.deprecated_call(match=rf"ElasticLocalSGDStrategy\({name}=\.\.\.\) is deprecated .*; {new}"):
        strategy = ElasticLocalSGDStrategy(lighthouse=LIGHTHOUSE, **{name: value})
    assert getattr(strategy.advanced, name) == value


def test_the_former_weighting_attribute_warns_and_reads_the_knob():
    strategy = ElasticLocalSGDStrategy(lighthouse=LIGHTHOUSE)
    with pytest.deprecated_call(match=r"\.pseudo_gradient_weighting is deprecated .*\.advanced\.pseudo_gradient"):
        assert strategy.pseudo_gradient_weighting == "mean"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"steps_per_round": 4, "round_length": 8}, "give round_length only"),
        ({"join_timeout_s": 7.0, "advanced": ElasticLocalSGDAdvanced()}, "give advanced only"),
        ({"steps_per_rund": 4}, "steps_per_rund"),  # SingleDeviceStrategy's own refusal
    ],
)
def test_an_old_keyword_with_its_new_place_or_an_unknown_one_is_refused(kwargs, error):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError, match=error):
            ElasticLocalSGDStrategy(lighthouse=LIGHTHOUSE, **kwargs)


@pytest.mark.parametrize(
    ("name", "value"),
    [("startup_timeout_s", 3.0), ("join_timeout_s", 1.0), ("heartbeat_timeout_s", 1.5)],
)
def test_the_synchronous_strategys_old_timeout_keywords_warn_and_still_take_effect(name, value):
    new = rf"use ElasticHeteroBatchStrategy\(advanced=ElasticHeteroBatchAdvanced\({name}=\.\.\.\)\)"
    with pytest.deprecated_call(match=rf"ElasticHeteroBatchStrategy\({name}=\.\.\.\) is deprecated .*; {new}"):
        strategy = ElasticHeteroBatchStrategy(lighthouse=LIGHTHOUSE, **{name: value})
    assert getattr(strategy.advanced, name) == getattr(strategy.connection, name) == value


def test_the_synchronous_strategys_knobs_are_checked_and_take_effect():
    with pytest.raises(ValueError, match="heartbeat_timeout_s must be > 0, got 0"):
        ElasticHeteroBatchAdvanced(heartbeat_timeout_s=0)
    strategy = ElasticHeteroBatchStrategy(lighthouse=LIGHTHOUSE, advanced=ElasticHeteroBatchAdvanced(join_timeout_s=1))
    assert strategy.connection.join_timeout_s == 1
    with pytest.raises(TypeError, match="advanced must be an ElasticHeteroBatchAdvanced, got ElasticLocalSGDAdvanced"):
        ElasticHeteroBatchStrategy(lighthouse=LIGHTHOUSE, advanced=ElasticLocalSGDAdvanced())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError, match="give advanced only"):
            ElasticHeteroBatchStrategy(lighthouse=LIGHTHOUSE, join_timeout_s=1, advanced=ElasticHeteroBatchAdvanced())
