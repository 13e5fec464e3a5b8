"""docker's pure parts: timed throughput across ranks, levels that keep OmniLearn's ratios, the sweep's pairs."""

from __future__ import annotations

import doctest

import pytest
from benchmarks.scenarios import docker as bench


def _epoch(epoch, start, end, samples):
    return {"epoch": epoch, "start": start, "end": end, "samples": samples}


def test_timed_throughput_spans_the_ranks_and_skips_the_warm_up():
    reports = [
        {"epochs": [_epoch(0, 0.0, 50.0, 100), _epoch(1, 100.0, 104.0, 300), _epoch(2, 110.0, 112.0, 300)]},
        {"epochs": [_epoch(0, 1.0, 60.0, 100), _epoch(1, 101.0, 106.0, 100), _epoch(2, 110.5, 114.0, 100)]},
    ]
    measured = bench.timed_throughput(reports)
    assert measured["epochs"] == [1, 2]
    assert measured["per_epoch"] == [400 / 6.0, 400 / 4.0]  # earliest start to latest end, both ranks' samples
    assert measured["throughput"] == pytest.approx(800 / 10.0)


@pytest.mark.parametrize("workers", sorted(bench.LEVELS))
def test_levels_keep_the_ratio_within_two_cores(workers):
    for name, quotas in bench.LEVELS[workers].items():
        assert len(quotas) == workers and sum(quotas) <= 2.0
        assert max(quotas) / min(quotas) == int(name[2:])


def test_docstring_examples_pass():
    result = doctest.testmod(bench)
    assert result.attempted >= 4 and result.failed == 0


def _row(method, throughput, repeat=0, pair=None, split=None):
    return {
        "workers": 2,
        "level": "HL4",
        "repeat": repeat,
        "pair": pair,
        "method": method,
        "split": split,
        "throughput": throughput,
    }


def test_best_static_split_is_the_fastest_static_run_of_that_repeat():
    rows = [
        _row("hetero", 300.0),
        _row("static", 210.0, split=[97, 31]),
        _row("static", 260.0, split=[105, 23]),
        _row("static", 280.0, repeat=1, split=[116, 12]),
    ]
    assert bench.best_static_split(rows, 2, "HL4", 0) == [105, 23]


def test_paired_runs_alternate_the_order_and_pair_ratios_stay_within_their_pair():
    runs = bench.paired_runs([105, 23], 3)
    assert [m for m, _, _ in runs] == ["hetero", "static", "static", "hetero", "hetero", "static"]
    assert [p for *_, p in runs] == [0, 0, 1, 1, 2, 2]
    rows = [
        _row("hetero", 200.0, pair=0),
        _row("static", 250.0, pair=0, split=[105, 23]),
        _row("static", 100.0, pair=1, split=[105, 23]),
        _row("hetero", 110.0, pair=1),
        _row("hetero", 400.0, repeat=1, pair=0),
        _row("static", 400.0, repeat=1, pair=0, split=[105, 23]),
        _row("static", 999.0, split=[105, 23]),
        _row("hetero", 1.0, pair=2),
    ]  # unpaired, incomplete: left out
    assert bench.paired_ratios(rows) == {(2, "HL4"): pytest.approx([0.8, 1.1, 1.0])}
    assert (
        "paired HeteroBatch / best static split: median 1.000"
        in bench.summarise([dict(r, ideal=500.0) for r in rows])[-1]
    )


def test_changes_after_warmup_counts_only_the_timed_epochs():
    history = [{"epoch": 0, "to": [103, 25]}, {"epoch": 0, "to": [106, 22]}, {"epoch": 1, "to": [105, 23]}]
    assert bench.changes_after_warmup({"history": history}) == 1
    assert bench.changes_after_warmup({"history": history[:2]}) == 0
    assert bench.changes_after_warmup(None) is None


@pytest.mark.parametrize("workers", sorted(bench.LEVELS))
def test_pinned_levels_give_each_container_its_core_beside_its_quota(workers):
    from lightning_hetero.emulation.config import load_config

    levels, cpusets = bench.LEVELS[workers], bench.pinned_cpusets(workers, 2)
    containers = f"containers=[{','.join(f'w{k}' for k in range(workers))}]"
    pinned = load_config(overrides=[containers, *bench.level_overrides(levels, cpusets)]).resolve_level("qHL4", 2)
    assert [a.cpuset for a in pinned.allocations] == cpusets
    assert [a.cpus for a in pinned.allocations] == levels["HL4"]
    floating = load_config(overrides=[containers, *bench.level_overrides(levels, None)]).resolve_level("qHL4", 2)
    assert [a.cpuset for a in floating.allocations] == [None] * workers
    slowest = levels["HL4"].index(min(levels["HL4"]))  # a quota only HL4 has: its standalone run takes that core
    assert bench.standalone_cpuset(levels, cpusets, levels["HL4"][slowest], 2) == cpusets[slowest]
    assert bench.standalone_cpuset(levels, None, levels["HL4"][slowest], 2) == "0-1"
