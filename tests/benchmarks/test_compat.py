"""The compat benchmark's pure parts: the per-usage medians against DDP and the table."""

from __future__ import annotations

from benchmarks.scenarios import compat as bench


def _seed(**accuracies):
    return {usage: {"status": "pass", "val_acc": acc} for usage, acc in accuracies.items()}


def test_medians_over_seeds_are_compared_with_ddps_on_the_same_usage():
    runs = {
        "ddp": [_seed(plain=0.80, onecycle=0.9), _seed(plain=0.82, onecycle=0.9), _seed(plain=0.70, onecycle=0.9)],
        "asp": [_seed(plain=0.79, onecycle=0.8), _seed(plain=0.60, onecycle=0.84), _seed(plain=0.81, onecycle=0.86)],
    }
    rows = {(r["usage"], r["feature"]): r for r in bench.summarise(runs, ["plain", "onecycle"])}
    assert rows[("plain", "asp")]["accuracy"] == 79.0 and rows[("plain", "asp")]["vs_ddp"] == -1.0
    assert rows[("plain", "asp")]["within"]
    assert rows[("onecycle", "asp")]["vs_ddp"] == -6.0 and not rows[("onecycle", "asp")]["within"]
    table = bench.format_table(list(rows.values()), ["ddp", "asp"])
    assert "84.0 (-6.0) *" in table and "79.0 (-1.0)" in table


def test_a_refused_usage_shows_its_status_instead_of_an_accuracy():
    runs = {"ddp": [_seed(plain=0.8)], "asp": [{"plain": {"status": "refused", "val_acc": None}}]}
    rows = bench.summarise(runs, ["plain"])
    assert rows[1]["accuracy"] is None and not rows[1]["within"]
    assert "refused" in bench.format_table(rows, ["ddp", "asp"])
