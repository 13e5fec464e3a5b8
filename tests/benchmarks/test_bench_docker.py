"""bench_docker's pure parts: timed throughput across ranks, levels that keep OmniLearn's ratios, --plot-only."""

from __future__ import annotations

import importlib.util
import json
import sys
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


def test_plot_only_writes_a_png_from_existing_json(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the plots extra)")
    rows = [
        {"workers": 2, "level": "HL4", "method": m, "throughput": t, "ideal": 100.0, "load_average_1min": 1.0}
        for m, t in (("ddp", 40.0), ("hetero", 55.0))
    ]
    path = tmp_path / "docker.json"
    path.write_text(json.dumps({"conditions": {"cpus": 2}, "rows": rows}))
    monkeypatch.setattr(sys, "argv", ["bench_docker.py", "--plot-only", str(path)])
    bench.main()
    assert (tmp_path / "docker.png").stat().st_size > 0
