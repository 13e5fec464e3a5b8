"""bench_gpu: the goal ratios, and the CPU smoke run of one case through the same driver the GPU check uses."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_gpu.py"
spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_summary_ratios_and_accuracy_points():
    reports = {
        "hetero": {"fit_s": 10.0, "val_acc": 0.8},
        "fixed": {"fit_s": 9.5, "val_acc": 0.8},
        "ddp": {"fit_s": 19.0, "val_acc": 0.8},
        "bsp": {"val_acc": 0.80},
        "local": {"val_acc": 0.79},
    }
    goals = bench.summarize(reports)
    assert goals["hetero_of_best_fixed"] == pytest.approx(0.95) and goals["ddp_of_best_fixed"] == pytest.approx(0.5)
    assert goals["local_minus_bsp_points"] == pytest.approx(-1.0) and goals["asp_minus_bsp_points"] is None


@pytest.mark.multiprocess
def test_the_cpu_smoke_run_writes_a_case_and_the_summary(tmp_path):
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--cases", "hetero", "--epochs", "1",
               "--samples", "1280", "--out", str(tmp_path)]  # fmt: skip
    subprocess.run(command, check=True, timeout=240, capture_output=True)
    summary = json.loads((tmp_path / "summary.json").read_text())
    case = summary["cases"]["hetero"]
    assert case["device"] == "cpu" and sum(case["final_split"]) == 256 and len(case["compiled_graphs_per_rank"]) == 2
