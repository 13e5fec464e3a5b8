"""the log_cost scenario: the summary's ratios, and one short real measurement of each variant."""

from __future__ import annotations

import pytest
from benchmarks.scenarios import log_cost as bench


def test_the_summary_takes_medians_and_divides_by_the_epoch_log_path():
    summary = bench.summarise({"log_float": [600.0, 500.0, 700.0], "epoch_log": [30.0, 10.0, 20.0]})
    assert summary["log_float"]["us_per_step_median"] == 600.0
    assert summary["log_float"]["over_epoch_log"] == pytest.approx(30.0)
    assert summary["epoch_log"]["over_epoch_log"] == pytest.approx(1.0)
    assert bench.summarise({"log_float": [1.0]})["log_float"]["over_epoch_log"] is None


@pytest.mark.parametrize("variant", bench.VARIANTS)
def test_each_variant_times_its_logging_calls(variant):
    assert bench.measure(variant, steps=5) > 0
