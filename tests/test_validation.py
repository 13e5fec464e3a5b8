"""Every float setting of the public API rejects NaN and infinities at construction, naming the setting."""

import math

import pytest

from lightning_hetero import (
    AsyncPSStrategy,
    BatchSizeController,
    FixedFractionPolicy,
    GreedyPolicy,
    HeteroBatchCallback,
    PhaseHyperparams,
    SlowdownEmulator,
    StragglerDetector,
    SyncSwitchCallback,
    ThroughputMeter,
    search_bsp_fraction,
)
from lightning_hetero.async_ps import PSAdvanced
from lightning_hetero.emulation.config import load_config
from lightning_hetero.hetero_batch.cost_model import PeriodCostModel
from lightning_hetero.hetero_batch.policy import AdjustmentPolicy

NAN, INF = math.nan, math.inf


def _never_run(fraction):
    raise AssertionError("the search must reject its settings before any run")


# (setting's name as the error names it, a constructor taking the bad value)
FLOAT_SETTINGS = [
    ("deadband", lambda v: HeteroBatchCallback(deadband=v)),
    ("smoothing", lambda v: HeteroBatchCallback(smoothing=v)),
    ("rollback_tolerance", lambda v: HeteroBatchCallback(rollback_tolerance=v)),
    ("change_tolerance", lambda v: HeteroBatchCallback(change_tolerance=v)),
    ("change_tolerance", lambda v: PeriodCostModel(change_tolerance=v)),
    ("min_spread", lambda v: PeriodCostModel(min_spread=v)),
    ("max_overhead_share", lambda v: PeriodCostModel(max_overhead_share=v)),
    (
        "rollback_tolerance",
        lambda v: AdjustmentPolicy(BatchSizeController(global_batch_size=64, world_size=2), rollback_tolerance=v),
    ),
    ("period_ms", lambda v: SlowdownEmulator(factors={1: 2.0}, throttle="cfs", period_ms=v)),
    ("deadband", lambda v: BatchSizeController(global_batch_size=64, world_size=2, deadband=v)),
    ("smoothing", lambda v: ThroughputMeter(smoothing=v)),
    ("fault_timeout_s", lambda v: AsyncPSStrategy(fault_timeout_s=v)),
    ("startup_timeout_s", lambda v: PSAdvanced(startup_timeout_s=v)),
    ("smoothing", lambda v: SyncSwitchCallback(smoothing=v)),
    ("lr_scale", lambda v: PhaseHyperparams(lr_scale=v)),
    ("momentum", lambda v: PhaseHyperparams(momentum=v)),
    ("momentum_ramp_start", lambda v: PhaseHyperparams(momentum_ramp_start=v)),
    ("bsp_fraction", lambda v: FixedFractionPolicy(bsp_fraction=v)),
    ("bsp_fraction", lambda v: GreedyPolicy(bsp_fraction=v)),
    ("threshold", lambda v: StragglerDetector(threshold=v)),
    ("tolerance", lambda v: search_bsp_fraction(_never_run, tolerance=v)),
    ("min_fraction", lambda v: search_bsp_fraction(_never_run, min_fraction=v)),
    (r"factors\[1\]", lambda v: SlowdownEmulator(factors={1: v})),
    (r"schedule\[0\]\[1\]", lambda v: SlowdownEmulator(schedule={0: {1: v}})),
    ("poll_interval_s", lambda v: load_config(overrides=[f"poll_interval_s={_yaml(v)}"])),
    (r"levels.x\[3\].cpus", lambda v: load_config(overrides=[f"levels.x=[1,1,1,{_yaml(v)}]"])),
    (
        r"schedule.steps\[1\].start",
        lambda v: load_config(
            overrides=[f"schedule.steps=[{{start: 0, level: HL1}}, {{start: {_yaml(v)}, level: HL2}}]"]
        ),
    ),
]


def _yaml(value):
    return ".nan" if math.isnan(value) else ".inf" if value > 0 else "-.inf"


@pytest.mark.parametrize("value", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize(
    ("name", "construct"), FLOAT_SETTINGS, ids=[f"{i}-{n}" for i, (n, _) in enumerate(FLOAT_SETTINGS)]
)
def test_non_finite_float_settings_are_rejected_naming_the_setting(name, construct, value):
    with pytest.raises(ValueError, match=name):
        construct(value)


@pytest.mark.parametrize(
    ("value", "kwargs", "message"),
    [
        (0, {"low": 0, "low_open": True}, "x must be > 0, got 0"),
        (2, {"low": 0, "high": 1}, r"x must be in \[0, 1\], got 2"),
        (1.5, {"low": 1, "integer": True}, "x must be an integer >= 1, got 1.5"),
        (None, {"low": 1}, "x must be >= 1, got None"),
        (True, {"low": 0}, "x must be >= 0, got True"),
        (INF, {"high": 5}, "x must be <= 5, got inf"),
        ("3", {}, "x must be a finite number, got '3'"),
    ],
)
def test_check_range_names_the_setting_and_the_accepted_range(value, kwargs, message):
    from lightning_hetero._validation import check_range

    with pytest.raises(ValueError, match=f"^{message}$"):
        check_range("x", value, **kwargs)


@pytest.mark.parametrize(("value", "kwargs"), [(0, {"low": 0}), (None, {"optional": True, "low": 0}), (1, {"high": 1})])
def test_check_range_accepts_the_bounds_it_states(value, kwargs):
    from lightning_hetero._validation import check_range

    check_range("x", value, **kwargs)
