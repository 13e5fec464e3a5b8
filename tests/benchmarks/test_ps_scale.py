"""ps_scale's pure parts: configuration and variant parsing, the per-variant medians."""

from __future__ import annotations

import pytest
from benchmarks.scenarios import ps_scale as bench


def test_configs_and_variants_parse_and_unknown_models_are_named():
    assert bench.parse_config("4x4.3Mx65") == {"workers": 4, "model": "4.3M", "step_ms": 65.0}
    with pytest.raises(ValueError, match="unknown model '3M'"):
        bench.parse_config("4x3Mx65")
    assert bench.parse_variant('overlap={"overlap_round_trip": true}') == {
        "label": "overlap", "kwargs": {"overlap_round_trip": True}, "source": ""
    }  # fmt: skip
    assert bench.parse_variant("main={}@/tmp/main/src") == {"label": "main", "kwargs": {}, "source": "/tmp/main/src"}


def test_summary_takes_medians_per_variant_over_repeats():
    def run(ratio, ideal, busy=None):
        variant = {"asp_over_ideal": ratio, "asp": {"samples_per_s": ratio * ideal}, "server_summary": None}
        if busy is not None:
            variant["server_busy_fraction"] = busy
        return {"ideal_samples_per_s": ideal, "standalone_step_ms": 5.0, "variants": {"a": variant}}

    row = bench.summarise([run(0.5, 100.0, 0.1), run(0.9, 200.0), run(0.7, 300.0, 0.3)], "a")
    assert row["asp_over_ideal_median"] == 0.7 and row["asp_over_ideal_each"] == [0.5, 0.9, 0.7]
    assert row["ideal_samples_per_s_median"] == 200.0 and row["server_busy_fraction_median"] == pytest.approx(0.2)
    assert row["staleness_mean_median"] is None  # no server summary in any repeat
