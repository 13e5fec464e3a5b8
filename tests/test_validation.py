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
from lightning_hetero.emulation.config import load_config
from lightning_hetero.hetero_batch.controller import AdjustmentPolicy
from lightning_hetero.hetero_batch.cost_model import PeriodCostModel

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
    ("startup_timeout_s", lambda v: AsyncPSStrategy(startup_timeout_s=v)),
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
