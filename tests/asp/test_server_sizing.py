"""The server-sizing rule applied to measured server statistics (issue 25: printed with the numbers, not applied by
hand)."""

import pytest

from lightning_hetero.asp.server_sizing import sizing_advice


def stats(busy_fraction: float, us_per_update: float = 500.0, us_per_mb: float = 500.0) -> dict:
    return {"busy_fraction": busy_fraction, "us_per_update": us_per_update, "us_per_mb": us_per_mb}


def test_a_server_busy_half_the_time_or_less_keeps_one_shard():
    advice = sizing_advice(stats(0.24), shards=1)
    assert advice.shards == 1
    assert "480 updates/s at 500 us/MB (1 MB), the server busy 24% of the time" in advice.message
    assert "keeps server_shards=1 and server_placement='worker'" in advice.message


@pytest.mark.parametrize(("busy", "shards", "recommended"), [(0.51, 1, 2), (0.9, 1, 2), (1.0, 1, 2), (0.8, 2, 4)])
def test_a_busy_server_is_sharded_to_half_load(busy, shards, recommended):
    """k = ceil(D / (0.5 C)): the demand over half a shard's capacity; with k shards measured, D = k x busy x C."""
    advice = sizing_advice(stats(busy), shards=shards)
    assert advice.shards == recommended
    assert f"recommends server_shards={recommended}" in advice.message


def test_no_updates_measured_gives_no_rate():
    assert "0 updates/s" in sizing_advice(stats(0.0, us_per_update=0.0), shards=1).message
