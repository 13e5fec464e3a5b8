"""the gpu scenario: the goal ratios, and the CPU smoke run of one case through the same driver the GPU check uses."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from benchmarks.harness.launch import ROOT, scenario_command
from benchmarks.scenarios import gpu as bench

from tests.helpers import run_command


def test_summary_medians_of_paired_ratios_and_accuracy_points():
    runs = {
        "hetero": [{"fit_s": 10.0, "val_acc": 0.8}, {"fit_s": 10.0, "val_acc": 0.8}, {"fit_s": 30.0, "val_acc": 0.8}],
        "fixed192": [{"fit_s": 9.5}, {"fit_s": 9.0}, {"fit_s": 9.0}],
        "fixed208": [{"fit_s": 12.0}, {"fit_s": 12.0}, {"fit_s": 12.0}],
        "ddp": [{"fit_s": 19.0}, {"fit_s": 18.0}, {"fit_s": 18.0}],
        "bsp": [{"val_acc": 0.80, "fit_s": 19.0}, {"val_acc": 0.70, "fit_s": 20.0}, {"val_acc": 0.75, "fit_s": 36.0}],
        "local": [{"val_acc": 0.79}, {"val_acc": 0.70}, {"val_acc": 0.74}],
        "compile": [{"compiled_graphs_per_rank": [2.0, 3.0]}],
    }
    goals = bench.summarize(runs)
    assert goals["best_fixed"] == "fixed192"
    assert goals["hetero_of_best_fixed"] == pytest.approx(0.9) and goals["ddp_of_best_fixed"] == pytest.approx(0.5)
    assert goals["local_minus_bsp_points"] == pytest.approx(-1.0) and goals["asp_minus_bsp_points"] is None
    assert goals["most_graphs_per_rank"] == 3.0
    assert goals["bsp_of_ddp"] == pytest.approx(0.9)  # BSP's throughput against DDP's: DDP's time over BSP's


def test_a_deep_network_of_distinct_layers_for_the_overlap_cell():
    net = bench.Model(layers=12).net
    linears = [module for module in net if isinstance(module, torch.nn.Linear)]
    assert len(linears) == 14 and len({id(layer.weight) for layer in linears}) == 14
    assert net(torch.zeros(3, 64)).shape == (3, 8)


def test_a_failed_seed_leaves_only_the_pairs_of_the_seeds_that_ran():
    runs = {"fixed192": [{"seed": 0, "fit_s": 9.0}, {"seed": 1, "fit_s": 8.0}], "hetero": [{"seed": 1, "fit_s": 10.0}]}
    assert bench.summarize(runs)["hetero_of_best_fixed"] == pytest.approx(0.8)  # seed 0 of hetero failed
    assert bench.summarize({"hetero": [{"seed": 0, "fit_s": 1.0}], "fixed192": []})["hetero_of_best_fixed"] is None


def test_a_job_that_fails_or_hangs_ends_both_ranks_and_says_why():
    hang = [sys.executable, "-c", "import os, time; time.sleep(0 if os.environ['NODE_RANK'] == '0' else 60)"]
    assert "ran past 1 s" in bench._two_ranks(hang, "cpu", timeout_s=1.0)
    fail = [
        sys.executable,
        "-c",
        "import os, sys, time; os.environ['NODE_RANK'] == '1' and sys.exit(3); time.sleep(60)",
    ]
    assert "(exit 3)" in bench._two_ranks(fail, "cpu", timeout_s=30.0)
    assert bench._two_ranks([sys.executable, "-c", "pass"], "cpu", timeout_s=30.0) is None


@pytest.mark.multiprocess
def test_the_cpu_smoke_run_writes_a_case_and_the_summary(tmp_path):
    command = [*scenario_command("gpu"), "--device", "cpu", "--cases", "hetero", "--seeds", "1", "--epochs", "1",
               "--samples", "1280", "--out", str(tmp_path)]  # fmt: skip
    run_command(command, timeout_s=240, cwd=ROOT)  # a failure shows what the driver and both ranks printed
    summary = json.loads((tmp_path / "summary.json").read_text())
    (case,) = summary["runs"]["hetero"]
    assert case["device"] == "cpu" and sum(case["final_split"]) == 256 and len(case["compiled_graphs_per_rank"]) == 2
