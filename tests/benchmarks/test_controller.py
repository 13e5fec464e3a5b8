"""bench_controller's pure parts: the paired re-measurement of the best static split, inversions, settling."""

from __future__ import annotations

import pytest
from benchmarks.scenarios import controller as bench


def test_paired_runs_rotate_which_arm_goes_first_and_pair_by_repeat():
    ours, best, plain = {"kind": "hetero"}, {"kind": "static", "split": [44, 20]}, {"kind": "hetero", "refine": False}
    order = bench.rotating_order([ours, best, plain], repeats=3)
    assert order == [ours, best, plain, best, plain, ours, plain, ours, best]
    assert bench.rotating_order([ours, best], repeats=2) == [ours, best, best, ours]
    results = [{"run": run, "value": i} for i, run in enumerate(order)]
    assert [r["value"] for r in bench.arm_runs(results, ours)] == [0, 5, 7]
    assert [r["value"] for r in bench.arm_runs(results, plain)] == [2, 4, 6]  # refine=False is another arm
    assert bench.paired_ratios([990.0, 1010.0], [1000.0, 1000.0]) == pytest.approx([0.99, 1.01])


def test_throughput_counts_samples_after_the_skipped_steps():
    result = {"starts": [0.0, 1.0, 2.0, 3.0, 4.0], "local_sizes": [[10, 10, 10, 10, 10], [6, 6, 6, 6, 6]]}
    # steps 2 and 3 counted (the last step has no end), from the start of step 2 to the start of step 4
    assert bench.throughput(result, skip=2) == pytest.approx(32 / 2.0)


def test_an_inversion_is_a_truly_slower_rank_with_more_samples():
    assert bench.worst_inversion([(40, 24), (30, 34)], factors=[1.0, 2.0]) == 4
    assert bench.worst_inversion([(40, 24)], factors=[1.0, 1.02]) == 0  # within 5%: not slower


def test_equal_ranks_rotate_three_arms_and_report_the_ddp_noise_floor(monkeypatch):
    launched = []

    def fake_launch(factors, runs, throttle, steps):
        launched.extend(runs)
        out = []
        for run in runs:
            # plain DDP 1000 samples/s, HeteroBatch 990 (one split change in its first run), the control arm 1005
            rate = 990.0 if run["kind"] == "hetero" else 1005.0 if run.get("control") else 1000.0
            history = [{"to": [33, 31]}] if len(out) == 1 else []
            starts = [i * 64 / rate for i in range(40)]
            out.append({"run": run, "starts": starts, "local_sizes": [[32] * 40, [32] * 40], "history": history})
        return out

    monkeypatch.setattr(bench, "launch", fake_launch)
    row = bench.homogeneous_scenario(type("Args", (), {"repeats": 3, "steps": 40})())
    ddp, hetero, control = {"kind": "ddp"}, {"kind": "hetero"}, {"kind": "ddp", "control": True}
    assert launched == [ddp, hetero, control, hetero, control, ddp, control, ddp, hetero]
    assert row["ratio_to_ddp"] == pytest.approx(0.99)
    assert row["ddp_control_ratio"] == pytest.approx(1.005)
    assert row["split_changes"] == [1, 0, 0]


def test_a_change_is_recorded_with_whether_a_speed_had_changed_and_the_step_it_was_judged_on():
    history = [
        {"step": 8, "to": (51, 13), "reason": "balance", "changed": [False, False], "sync_step_s": 0.12},
        {"step": 16, "to": (46, 18), "reason": "balance", "changed": [True, False], "sync_step_s": 0.07},
    ]
    records = [bench.change_record(h) for h in history]
    assert records == [(8, [51, 13], "balance", False, 0.12), (16, [46, 18], "balance", True, 0.07)]


def test_first_epoch_pairs_the_default_cadence_and_epoch_end_adjustments_with_the_proportional_split(monkeypatch):
    launched = []

    def fake_launch(factors, runs, throttle, steps, compute):
        launched.extend(runs)
        rates = {None: 800.0, steps + 1: 500.0}  # the default cadence, epoch ends only; the static split 1000
        out = []
        for run in runs:
            rate = rates[run["options"]["adjust_every_n_steps"]] if run["kind"] == "hetero" else 1000.0
            starts = [i * 64 / rate for i in range(steps)]
            history = [{"step": 10, "to": [52, 12], "reason": "balance", "changed": [False, False], "sync_step_s": 0.1}]
            out.append({"run": run, "starts": starts, "local_sizes": [[32] * steps, [32] * steps], "history": history})
        return out

    monkeypatch.setattr(bench, "launch", fake_launch)
    args = type("Args", (), {"paired": 2, "steps": 40})()
    row = bench.first_epoch_scenario("first epoch", [1.0, 4.0], "sleep", args)
    default = {"kind": "hetero", "options": {"adjust_every_n_steps": None}}
    epoch_ends = {"kind": "hetero", "options": {"adjust_every_n_steps": 41}}
    static = {"kind": "static", "split": [52, 12]}
    assert launched == [default, epoch_ends, static, epoch_ends, static, default]
    assert row["first_epoch"] == pytest.approx({"default": 0.8, "epoch_ends": 0.5})
    assert row["default_changes"] == [[(10, [52, 12], "balance", False, 0.1)]] * 2


def test_a_flip_under_the_default_cadence_runs_one_long_epoch_and_counts_periods_of_32_steps(monkeypatch):
    launched = {}

    def fake_launch(factors, runs, throttle, steps, **extra):
        launched.update(runs=runs, steps=steps, **extra)
        switch = extra["switch_step"]
        # [54, 10] before the flip; the first adjustment after it (step 128) moves to [15, 49], the next to [10, 54]
        sizes = [[54, 10] if s < 128 else [15, 49] if s < 160 else [10, 54] for s in range(steps)]
        history = [{"step": s} for s in (10, 18, 128, 160, 224)]
        assert switch == 98
        local_sizes = [list(rank) for rank in zip(*sizes, strict=True)]
        return [{"run": run, "local_sizes": local_sizes, "history": history} for run in runs]

    monkeypatch.setattr(bench, "launch", fake_launch)
    args = type("Args", (), {"repeats": 2})()
    row = bench.flip_scenario("flip", [1.0, 4.0], "cfs", args, "spin", default_cadence=True)
    assert launched["runs"] == [{"kind": "hetero", "options": {"adjust_every_n_steps": None}}] * 2
    assert launched["steps"] == 98 + 5 * 32 and launched["compute"] == "spin"
    assert launched["factors_after"] == "4,1"
    assert row["period"] == 32 and row["cadence"] == "default"
    # within 10% of the batch (6.4 samples) of [10, 54] from step 128: 30 steps after the switch, 0.94 periods
    assert row["settled_periods"] == pytest.approx(30 / 32)
    assert row["overshoot"] == 0.0
    # the early adjustments (10, 18) and those that followed the flip (128, 160) are not quiet; one at 224 is
    assert row["quiet_changes"] == [1, 1]


def test_defaults_run_the_static_scenarios_controller_at_the_default_cadence_counted_after_its_early_adjustments(
    monkeypatch,
):
    launched = []

    def fake_launch(factors, runs, throttle, steps, compute, cost_s):
        launched.append(runs)
        out = []
        for run in runs:
            # the controller's first 24 steps (its early adjustments) take 1 s, every other step 0.1 s
            slow = 24 if run["kind"] == "hetero" else 0
            starts = [min(i, slow) * 1.0 + max(0, i - slow) * 0.1 for i in range(steps)]
            out.append({"run": run, "starts": starts, "local_sizes": [[52] * steps, [12] * steps], "history": []})
        return out

    monkeypatch.setattr(bench, "launch", fake_launch)
    args = type(
        "Args", (), {"repeats": 1, "paired": 2, "steps": 96, "defaults": True, "ablate_refine": False, "cost_s": 1e-3}
    )()
    row = bench.static_scenario("cfs 1/4", [1.0, 4.0], "cfs", args)
    controller = {"kind": "hetero", "options": {"adjust_every_n_steps": None}}
    assert launched[0][0] == controller and launched[1] == [controller, launched[1][1], launched[1][1], controller]
    assert row["fraction_of_best_static"] == pytest.approx(1.0)  # counted from step 24: as fast as the static split
    args.defaults = False
    row = bench.static_scenario("cfs 1/4", [1.0, 4.0], "cfs", args)
    assert launched[2][0] == {"kind": "hetero"}
    assert row["fraction_of_best_static"] == pytest.approx(7.9 / 15.1)  # from step 16: 8 slow steps count
