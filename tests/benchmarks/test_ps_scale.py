"""bench_ps_scale's pure parts: configuration and variant parsing, the per-variant medians, the server capacity."""

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


def test_server_capacity_runs_every_shard_and_reports_its_rate():
    for shards in (1, 2):
        result = bench.server_capacity("0.25M", layers=4, shards=shards, updates=2)
        assert result["shards"] == shards and result["mb_per_s"] > 0
        assert result["largest_shard_share"] == pytest.approx(1 / shards, rel=0.01)


def test_a_dedicated_server_rank_adds_a_rank_or_takes_a_training_one_and_the_ideal_follows_the_training_ranks():
    dedicated = {"server_placement": "dedicated"}
    assert bench.job_ranks(2, dedicated, "extra") == (3, 2) and bench.job_ranks(2, dedicated, "within") == (2, 1)
    assert bench.job_ranks(2, {"server_placement": "worker"}, "within") == (2, 2)
    assert [v["kwargs"] for v in bench.placement_variants("worker,dedicated")] == [
        {"server_placement": "worker"},
        dedicated,
    ]

    def run(worker_rate, dedicated_rate, dedicated_training):
        variants = {
            "worker": {"asp": {"samples_per_s": worker_rate}, "server_summary": None, "over_first": 1.0,
                       "ideal_samples_per_s": 100.0, "asp_over_ideal": worker_rate / 100.0},
            "dedicated": {"asp": {"samples_per_s": dedicated_rate}, "server_summary": None,
                          "over_first": dedicated_rate / worker_rate, "ideal_samples_per_s": 50.0 * dedicated_training,
                          "asp_over_ideal": dedicated_rate / (50.0 * dedicated_training)},
        }  # fmt: skip
        return {"ideal_samples_per_s": 100.0, "standalone_step_ms": 5.0, "variants": variants}

    row = bench.summarise([run(80.0, 40.0, 1), run(90.0, 45.0, 1), run(70.0, 42.0, 1)], "dedicated")
    assert row["ideal_samples_per_s_median"] == 50.0  # one training worker of two standalone ones
    assert row["over_first_each"] == [0.5, 0.5, 0.6] and row["over_first_median"] == 0.5
    assert row["asp_over_ideal_median"] == 0.84
