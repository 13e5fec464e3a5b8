"""local_sgd_breakdown's arithmetic: each rank's time split into categories that add up to the epochs' spans."""

from __future__ import annotations

import doctest

import pytest
from benchmarks.scenarios import local_sgd_breakdown as breakdown


def _epoch(start, end, batches, rounds, claims=()):
    return {"start": start, "end": end, "batches": batches, "rounds": rounds, "claims": list(claims)}


def test_categories_add_up_to_the_spans_and_idle_time_is_measured_from_the_last_arrival():
    warmup = _epoch(0.0, 1.0, [[0.0, 1.0]], [[0.5, 0.6, 0.0, True, 8]])
    fast = _epoch(10.0, 12.0, [[10.0, 10.5], [10.6, 11.8]], [[11.0, 11.7, 0.1, False, 8]], claims=[[10.5, 10.55]])
    slow = _epoch(10.2, 12.0, [[10.2, 11.9]], [[11.5, 11.7, 0.1, True, 8]])
    result = breakdown.breakdown([[warmup, fast], [warmup, slow]])  # the first epoch is left out
    assert result["span_s"] == pytest.approx(2.0) and result["round_ends"] == 1
    fast_s, slow_s = result["per_rank_s"]
    assert fast_s["round_wait"] == pytest.approx(0.5) and slow_s["round_wait"] == pytest.approx(0.0)
    assert fast_s["round_sync"] == pytest.approx(0.2) and slow_s["round_sync"] == pytest.approx(0.2)
    assert fast_s["claims"] == pytest.approx(0.05) and fast_s["between_batches"] == pytest.approx(0.05)
    assert fast_s["compute"] == pytest.approx(0.5 + 1.2 - 0.7)
    assert slow_s["epoch_edges"] == pytest.approx(0.2 + 0.1)
    for rank in (fast_s, slow_s):
        assert sum(rank.values()) == pytest.approx(result["span_s"])
    assert result["arrival_after_first_s"] == [pytest.approx([0.0, 0.5])]
    line = breakdown.format_breakdown(result, ranks=2)
    assert line.startswith("compute ") and line.endswith("(1 round ends)")


def test_docstring_examples():
    assert doctest.testmod(breakdown).failed == 0
