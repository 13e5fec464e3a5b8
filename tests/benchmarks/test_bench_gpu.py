"""bench_gpu: the goal ratios, and the CPU smoke run of one case through the same driver the GPU check uses."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.helpers import run_command

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_gpu.py"
spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_summary_medians_of_paired_ratios_and_accuracy_points():
    runs = {
        "hetero": [{"fit_s": 10.0, "val_acc": 0.8}, {"fit_s": 10.0, "val_acc": 0.8}, {"fit_s": 30.0, "val_acc": 0.8}],
        "fixed192": [{"fit_s": 9.5}, {"fit_s": 9.0}, {"fit_s": 9.0}],
        "fixed208": [{"fit_s": 12.0}, {"fit_s": 12.0}, {"fit_s": 12.0}],
        "ddp": [{"fit_s": 19.0}, {"fit_s": 18.0}, {"fit_s": 18.0}],
        "bsp": [{"val_acc": 0.80}, {"val_acc": 0.70}, {"val_acc": 0.75}],
        "local": [{"val_acc": 0.79}, {"val_acc": 0.70}, {"val_acc": 0.74}],
        "compile": [{"compiled_graphs_per_rank": [2.0, 3.0]}],
    }
    goals = bench.summarize(runs)
    assert goals["best_fixed"] == "fixed192"
    assert goals["hetero_of_best_fixed"] == pytest.approx(0.9) and goals["ddp_of_best_fixed"] == pytest.approx(0.5)
    assert goals["local_minus_bsp_points"] == pytest.approx(-1.0) and goals["asp_minus_bsp_points"] is None
    assert goals["most_graphs_per_rank"] == 3.0


@pytest.mark.multiprocess
def test_the_cpu_smoke_run_writes_a_case_and_the_summary(tmp_path):
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--cases", "hetero", "--seeds", "1", "--epochs", "1",
               "--samples", "1280", "--out", str(tmp_path)]  # fmt: skip
    run_command(command, timeout_s=240)  # a failure shows what the driver and both ranks printed
    summary = json.loads((tmp_path / "summary.json").read_text())
    (case,) = summary["runs"]["hetero"]
    assert case["device"] == "cpu" and sum(case["final_split"]) == 256 and len(case["compiled_graphs_per_rank"]) == 2
