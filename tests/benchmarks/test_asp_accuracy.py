"""asp_accuracy's pure parts: slowdown factors, cell order and the seed-paired summary."""

from __future__ import annotations

import pytest
from benchmarks.harness.models import slowdown_factors
from benchmarks.scenarios import asp_accuracy as bench


def _run(config, seed, acc, train_s, workers=2, staleness=None, momentum=None):
    return {
        "config": config, "workers": workers, "hl": 4.0, "seed": seed, "final_acc": acc, "train_s": train_s,
        "staleness_mean": staleness, "staleness_max": None if staleness is None else 3,
        "asp_momentum_effective_mean": momentum,
    }  # fmt: skip


def test_slowdown_factors_span_the_heterogeneity_level_with_rank_zero_fastest():
    factors = slowdown_factors(8, 4.0)
    assert factors[0] == 1.0 and factors[-1] == pytest.approx(4.0)
    assert factors == sorted(factors)
    assert slowdown_factors(4, 1.0) == [1.0] * 4


def test_summary_pairs_differences_to_bsp_by_seed():
    runs = [
        _run("bsp", 0, 0.90, 10.0),
        _run("bsp", 1, 0.80, 20.0),
        _run("asp", 0, 0.89, 5.0, staleness=1.0, momentum=0.8),
        _run("asp", 1, 0.81, 5.0, staleness=1.0, momentum=0.8),
    ]
    rows = {row["config"]: row for row in bench.summarise(runs)}
    asp = rows["asp"]
    # unpaired, ASP's mean equals BSP's; paired by seed, the differences are -1 and +1 point
    assert asp["acc_mean"] == pytest.approx(rows["bsp"]["acc_mean"])
    assert asp["acc_vs_bsp_points"] == pytest.approx(0.0)
    assert asp["acc_vs_bsp_points_sd"] == pytest.approx(2**0.5)
    assert asp["time_vs_bsp"] == pytest.approx((0.5 + 0.25) / 2)
    assert asp["asp_momentum_effective"] == pytest.approx(0.8) and asp["staleness_max"] == 3
    assert rows["bsp"]["acc_vs_bsp_points"] == 0.0


def test_cells_start_with_the_highest_heterogeneity_and_fewest_workers():
    assert bench.cell_order([8, 2], [1.0, 4.0])[:2] == [(2, 4.0), (8, 4.0)]
