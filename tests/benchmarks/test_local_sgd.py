"""bench_local_sgd's pure parts: slowdown factors, time to accuracy and the seed-paired summary."""

from __future__ import annotations

import pytest
from benchmarks.harness.models import slowdown_factors
from benchmarks.scenarios import local_sgd as bench


def _run(config, seed, accs, train_s=1.0, throughput=100.0, bound=200.0):
    epochs = [{"train_s": train_s, "val_acc": acc, "samples": 100} for acc in accs]
    return {
        "config": config, "model": "light", "workers": 4, "hl": 4.0, "seed": seed, "final_acc": accs[-1],
        "epochs": epochs, "throughput": throughput, "of_standalone_bound": throughput / bound,
        "bytes_per_sample": 10.0,
    }  # fmt: skip


def test_slowdown_factors_span_the_heterogeneity_level():
    factors = slowdown_factors(4, 8.0)
    assert factors[0] == 1.0 and factors[-1] == pytest.approx(8.0) and factors == sorted(factors)


def test_time_to_target_counts_training_time_up_to_the_first_epoch_reaching_it():
    epochs = [{"train_s": 2.0, "val_acc": 0.7}, {"train_s": 1.0, "val_acc": 0.9}, {"train_s": 1.0, "val_acc": 0.95}]
    assert bench.time_to_target(epochs, 0.9) == 3.0
    assert bench.time_to_target(epochs, 0.99) is None


def test_time_to_target_uses_the_finer_curve_when_there_is_one():
    epochs = [{"train_s": 2.0, "val_acc": 0.9}]
    assert bench.time_to_target(epochs, 0.9, curve=[(0.4, 0.5), (1.2, 0.91), (2.0, 0.9)]) == 1.2
    assert bench.time_to_target(epochs, 0.9, curve=[]) == 2.0  # ASP keeps no curve: epoch ends


def test_curve_times_leave_out_the_time_between_epochs():
    epochs = [{"start": 10.0, "train_s": 1.0}, {"start": 20.0, "train_s": 1.5}]  # validation from 11 to 20
    assert bench.curve_times(epochs, [(0, 10.5), (0, 11.0), (1, 20.5), (1, 21.5)]) == [0.5, 1.0, 1.5, 2.5]


def test_summary_pairs_accuracy_and_time_to_accuracy_with_the_seeds_ddp_run():
    runs = [
        _run("ddp", 0, [0.80, 0.90]),
        _run("ddp", 1, [0.70, 0.80]),
        _run("local_prop", 0, [0.89, 0.91], train_s=0.5, throughput=190.0),
        _run("local_prop", 1, [0.70, 0.79], train_s=0.5, throughput=180.0),
    ]
    rows = {row["config"]: row for row in bench.summarise(runs)}
    local = rows["local_prop"]
    assert local["acc_vs_ddp_points_all"] == pytest.approx([1.0, -1.0])
    # seed 0: 0.89 < 0.90 - 0.005 after the first epoch, 0.91 after the second (1.0 s); seed 1: 0.79 < 0.795 never
    assert local["time_to_ddp_acc_all"] == [1.0, None] and local["reached_ddp_acc"] == 1
    assert local["of_standalone_bound"] == pytest.approx(0.925)
    assert rows["ddp"]["time_to_ddp_acc_all"] == [2.0, 2.0]


def test_summary_times_accuracy_on_the_curve():
    runs = [_run("ddp", 0, [0.80, 0.90]), _run("local_prop", 0, [0.89, 0.91], train_s=0.5)]
    runs[1]["curve"] = [(0.25, 0.80), (0.5, 0.89), (0.7, 0.897), (1.0, 0.91)]
    assert bench.summarise(runs)[1]["time_to_ddp_acc_all"] == [0.7]
