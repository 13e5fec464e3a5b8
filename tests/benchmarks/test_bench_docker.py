"""bench_docker's pure parts: timed throughput across ranks, and levels that keep OmniLearn's ratios."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_docker.py"
spec = importlib.util.spec_from_file_location("bench_docker", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


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
