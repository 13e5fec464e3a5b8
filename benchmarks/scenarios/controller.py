"""HeteroBatchCallback's controller against the best static split found by a sweep (``controller_worker.py``).

2 and 4 DDP ranks, global batch 64, slowed by sleeps, a CPU quota (``cfs``) or a quota on real work (``cfs cpu``);
the figure is the median ratio of ``--paired`` controller / best-split pairs. ``--factors``: one custom scenario.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from benchmarks.harness.grid import Cell
from benchmarks.harness.launch import RESULTS, child_env, module_command, run_json
from benchmarks.harness.models import flags
from benchmarks.harness.record import table, write_json
from benchmarks.harness.stats import paired_ratios, proportional_splits, rotating_order
from lightning_hetero.hetero_batch.period import STEADY_PERIOD

GLOBAL_BATCH = 64
PERIOD = 8
#: the controller at the callback's default cadence (adjust_every_n_steps=None), as a worker's run
DEFAULT_CADENCE_RUN = {"kind": "hetero", "options": {"adjust_every_n_steps": None}}

# 4-rank factors relative to the fastest rank, from OmniLearn's BSP core counts (HL2: 12,12,8,16 cores, ...)
FOUR_RANKS = {"HL2": [16 / 12, 16 / 12, 2.0, 1.0], "HL4": [24 / 9, 24 / 9, 4.0, 1.0], "HL8": [32 / 6, 32 / 6, 8.0, 1.0]}
TWO_RANKS = {"HL2": [1.0, 2.0], "HL4": [1.0, 4.0], "HL8": [1.0, 8.0]}


def launch(factors: list[float], runs: list[dict], throttle: str, steps: int, **extra: object) -> list[dict]:
    settings = flags(throttle=throttle, factors=",".join(f"{f:.4g}" for f in factors), steps=steps,
                     global_batch=GLOBAL_BATCH, adjust_every=PERIOD, **extra)  # fmt: skip
    command = lambda out: module_command("controller_worker", out, "--runs", json.dumps(runs), *settings)  # noqa: E731
    return run_json(command, env=child_env(PYTHONWARNINGS="ignore"))


def throughput(result: dict, skip: int) -> float:
    starts, sizes = result["starts"], [sum(step) for step in zip(*result["local_sizes"], strict=True)]
    return sum(sizes[skip:-1]) / (starts[-1] - starts[skip])


def splits_per_step(result: dict) -> list[tuple[int, ...]]:
    return [tuple(step) for step in zip(*result["local_sizes"], strict=True)]


def worst_inversion(splits: list[tuple[int, ...]], factors: list[float]) -> int:
    """Largest b_slow - b_fast over steps and rank pairs where the slow rank is truly slower (0: none)."""
    worst = 0
    for split in splits:
        for i, fi in enumerate(factors):
            for j, fj in enumerate(factors):
                if fi > fj * 1.05:
                    worst = max(worst, split[i] - split[j])
    return worst


def settling(splits: list[tuple[int, ...]], switch: int, before: tuple[int, ...], period: int = PERIOD) -> dict:
    """Adjustment periods (of ``period`` steps) after ``switch`` until the split stays within 10% of the global batch
    of its final value, and the overshoot beyond the final split (fraction of that rank's final batch)."""
    final = splits[-1]
    tolerance = 0.1 * GLOBAL_BATCH
    after = splits[switch:]
    settled_at = len(after)
    for index in range(len(after) - 1, -1, -1):
        if max(abs(b - f) for b, f in zip(after[index], final, strict=True)) > tolerance:
            break
        settled_at = index
    overshoot = 0.0
    for k, (start, end) in enumerate(zip(before, final, strict=True)):
        direction = (end > start) - (end < start)
        if direction:
            beyond = max(direction * (split[k] - end) for split in after)
            overshoot = max(overshoot, beyond / end)
    return {"settled_periods": settled_at / period, "overshoot": overshoot, "final": list(final)}


def static_candidates(factors: list[float]) -> list[list[int]]:
    """Splits proportional to speed**gamma, around the plain proportional split (gamma = 1)."""
    gammas = [0.7, 0.85, 1.0, 1.15, 1.3, 1.6] if len(factors) == 2 else [0.8, 1.0, 1.3]
    return proportional_splits([1 / f for f in factors], GLOBAL_BATCH, gammas)


def arm_runs(results: list[dict], arm: dict) -> list[dict]:
    """The results of ``arm``'s runs, in the order they ran (the i-th is repeat i)."""
    return [r for r in results if r["run"] == arm]


def static_scenario(
    name: str, factors: list[float], throttle: str, args: argparse.Namespace, compute: str = "sleep"
) -> dict:
    candidates = static_candidates(factors)
    # the controller adjusting every PERIOD steps, or at the default cadence (after steps 10 and 18, then every 32)
    controller = DEFAULT_CADENCE_RUN if args.defaults else {"kind": "hetero"}
    runs = [controller] + [{"kind": "static", "split": split} for split in candidates]
    repeats = args.repeats if len(factors) == 2 else max(1, args.repeats - 1)  # 4 ranks: one repeat fewer (time)
    compute = {"compute": compute, "cost_s": args.cost_s}
    results = launch(factors, runs * repeats, throttle, args.steps, **compute)
    skip = (3 if args.defaults else 2) * PERIOD  # the default cadence's early adjustments end at step 18
    static = {
        tuple(split): statistics.median(
            throughput(r, skip) for r in results if r["run"].get("split") == split and r["run"]["kind"] == "static"
        )
        for split in candidates
    }
    best_split, sweep_best = max(static.items(), key=lambda item: item[1])
    sweep_ours = statistics.median(throughput(r, skip) for r in results if r["run"]["kind"] == "hetero")
    row = {
        "scenario": name,
        "ranks": len(factors),
        "factors": factors,
        "throttle": throttle,
        "best_static_split": list(best_split),
        "sweep_best_samples_per_s": sweep_best,
        "sweep_controller_samples_per_s": sweep_ours,
        "static_sweep": {str(list(k)): v for k, v in static.items()},
        "fraction_of_sweep_max": sweep_ours / sweep_best,
    }
    # re-measure the sweep's pick side by side with the controller: the arms of each repeat run back to back, their
    # order rotating from one repeat to the next
    arms = [controller, {"kind": "static", "split": list(best_split)}]
    paired = launch(factors, rotating_order(arms, args.paired), throttle, args.steps, **compute)
    ours_runs, best_runs = ([throughput(r, skip) for r in arm_runs(paired, arm)] for arm in arms)
    ratios = paired_ratios(ours_runs, best_runs)
    hetero = arm_runs(paired, arms[0])
    row |= {
        "paired_repeats": args.paired,
        "controller_runs": ours_runs,
        "best_static_runs": best_runs,
        "paired_ratios": ratios,
        "controller_samples_per_s": statistics.median(ours_runs),
        "best_static_samples_per_s": statistics.median(best_runs),
        "fraction_of_best_static": statistics.median(ratios),
    }
    return row | {
        "split_changes": statistics.median(len(r["history"]) for r in hetero),
        "rollbacks": statistics.median(sum(h["reason"] == "rollback" for h in r["history"]) for r in hetero),
        # changes in the run's second half: 0 once the split has settled (the speeds do not change here)
        "late_changes": [sum(h["step"] >= args.steps // 2 for h in r["history"]) for r in hetero],
        "worst_inversion": max(worst_inversion(splits_per_step(r), factors) for r in hetero),
        "final_splits": [list(splits_per_step(r)[-1]) for r in hetero],
        # each change: step, split, reason, whether a rank's measured speed had changed, the synchronous step before
        "changes": [[change_record(h) for h in r["history"]] for r in hetero],
    }


def first_epoch_scenario(
    name: str, factors: list[float], throttle: str, args: argparse.Namespace, compute: str = "sleep"
) -> dict:
    """A first epoch of ``--steps`` steps from the equal split: what the default cadence's early adjustments are
    worth there, against adjustments at epoch ends only (which change nothing inside it) and a good static split."""
    proportional = proportional_splits([1 / f for f in factors], GLOBAL_BATCH)[0]  # in proportion to speed
    arms = {
        "default": DEFAULT_CADENCE_RUN,
        "epoch_ends": {"kind": "hetero", "options": {"adjust_every_n_steps": args.steps + 1}},
        "static": {"kind": "static", "split": proportional},
    }
    results = launch(factors, rotating_order(list(arms.values()), args.paired), throttle, args.steps, compute=compute)
    runs = {key: [throughput(r, 1) for r in arm_runs(results, arm)] for key, arm in arms.items()}
    default = arm_runs(results, arms["default"])
    first_epoch = {key: statistics.median(paired_ratios(runs[key], runs["static"])) for key in arms if key != "static"}
    return {
        "scenario": name,
        "ranks": len(factors),
        "factors": factors,
        "throttle": throttle,
        "compute": compute,
        "static_split": proportional,
        "samples_per_s": runs,
        "first_epoch": first_epoch,
        "default_changes": [[change_record(h) for h in r["history"]] for r in default],
        "default_final_splits": [list(splits_per_step(r)[-1]) for r in default],
    }


def change_record(change: dict) -> tuple:
    """One split change as the JSON keeps it: why it was made, and on what evidence."""
    return change["step"], list(change["to"]), change["reason"], any(change["changed"]), change["sync_step_s"]


def flip_scenario(
    name: str,
    factors: list[float],
    throttle: str,
    args: argparse.Namespace,
    compute: str = "sleep",
    default_cadence: bool = False,
) -> dict:
    """The slow and fast ranks swap two steps after an adjustment (the least favourable moment): adjustments every
    ``PERIOD`` steps, or with ``default_cadence`` the callback's default cadence in one long epoch (early adjustments
    at its start, then every ``STEADY_PERIOD`` steps), periods counted in the cadence's own steps."""
    period = STEADY_PERIOD if default_cadence else PERIOD
    switch = (3 if default_cadence else 6) * period + 2
    after = list(reversed(factors))
    steps = switch + (5 if default_cadence else 8) * period
    run = DEFAULT_CADENCE_RUN if default_cadence else {"kind": "hetero"}
    flip = {"factors_after": ",".join(f"{f:.4g}" for f in after), "switch_step": switch}
    results = launch(factors, [run] * args.repeats, throttle, steps, compute=compute, **flip)
    rows = []
    for r in results:
        splits = splits_per_step(r)
        first_adjustment = (switch // period + 1) * period  # the first adjustment after the change
        change_steps = [h["step"] for h in r["history"]]
        rows.append(
            settling(splits, switch, splits[switch - 1], period)
            | {
                "worst_inversion_after_first_adjustment": worst_inversion(splits[first_adjustment + 1 :], after),
                "split_changes": len(r["history"]),
                # changes while the speeds stay put: after two periods before the switch, and from three periods
                # after it (settled within two); both 0 for a controller that settles and stays
                "quiet_changes": sum(2 * period <= s < switch or s >= switch + 3 * period for s in change_steps),
                "change_steps": change_steps,
                "splits_after_switch": [list(s) for s in splits[switch - 2 :: period]],
            }
        )
    return {
        "scenario": name, "ranks": len(factors), "factors_before": factors, "factors_after": after,
        "throttle": throttle, "compute": compute, "cadence": "default" if default_cadence else f"every {PERIOD} steps",
        "period": period, "switch_step": switch,
        "settled_periods": statistics.median(row["settled_periods"] for row in rows),
        "overshoot": statistics.median(row["overshoot"] for row in rows),
        "worst_inversion_after_first_adjustment": max(row["worst_inversion_after_first_adjustment"] for row in rows),
        "quiet_changes": [row["quiet_changes"] for row in rows],
        "runs": rows,
    }  # fmt: skip


def homogeneous_scenario(args: argparse.Namespace) -> dict:
    # a second plain-DDP arm measures the noise floor of the comparison (DDP against itself); which arm goes first
    # rotates from one repeat to the next, so no arm always runs right after the same other one
    arms = [{"kind": "ddp"}, {"kind": "hetero"}, {"kind": "ddp", "control": True}]
    results = launch([1.0, 1.0], rotating_order(arms, args.repeats), "sleep", args.steps)
    skip = 2 * PERIOD
    ddp, hetero, control = ([throughput(r, skip) for r in arm_runs(results, arm)] for arm in arms)
    ratios = paired_ratios(hetero, ddp)
    control_ratios = paired_ratios(control, ddp)
    return {
        "scenario": "homogeneous",
        "ranks": 2,
        "ddp_samples_per_s": statistics.median(ddp),
        "controller_samples_per_s": statistics.median(hetero),
        "ratio_to_ddp": statistics.median(ratios),
        "ratios": ratios,
        "ddp_control_ratio": statistics.median(control_ratios),
        "ddp_control_ratios": control_ratios,
        "split_changes": [len(r["history"]) for r in arm_runs(results, arms[1])],
    }


def print_table(args: argparse.Namespace, results: list[dict]) -> None:
    cadence = "the default cadence" if args.defaults else f"adjust every {PERIOD} steps"
    print(f"\nController: global batch {GLOBAL_BATCH}; {cadence}; {args.repeats} interleaved repeats, medians")
    keys = ("controller_samples_per_s", "best_static_samples_per_s", "best_static_split", "fraction_of_best_static",
            "fraction_of_sweep_max", "split_changes", "worst_inversion", "late_changes")  # fmt: skip
    header = ["scenario", "ctrl/s", "static/s", "split", "fraction", "vs sweep max", "changes", "inversion", "late"]
    cells = [[row["title"], *(row[key] for key in keys)] for row in results if "fraction_of_best_static" in row]
    print(table(header, cells, ["", ".0f", ".0f", "", ".3f", ".3f"]))
    for row in results:
        if "settled_periods" in row:
            print(
                f"{row['title']:<24} settled after {row['settled_periods']:.2f} periods of {row['period']} steps, "
                f"overshoot {row['overshoot']:.0%}, worst inversion after the first adjustment "
                f"{row['worst_inversion_after_first_adjustment']}, changes while the speeds stayed put "
                f"{row['quiet_changes']}"
            )
        if "first_epoch" in row:
            fractions = row["first_epoch"]
            print(
                f"{row['title']:<24} first epoch over the static split {row['static_split']}: default "
                f"{fractions['default']:.3f}, adjusting at epoch ends only "
                f"{fractions['epoch_ends']:.3f}"
            )
        if row["scenario"] == "homogeneous":
            ratios = ", ".join(f"{r:.3f}" for r in row["ratios"])
            print(
                f"{row['title']:<24} HeteroBatch / DDP = {row['ratio_to_ddp']:.3f} (runs {ratios}); "
                f"DDP / DDP (noise floor) = {row['ddp_control_ratio']:.3f}; "
                f"split changes {row['split_changes']}"
            )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=96)
    parser.add_argument("--paired", type=int, default=5, help="controller / best-static pairs after the sweep")
    parser.add_argument("--defaults", action="store_true", help="the controller at the callback's default cadence")
    parser.add_argument("--only", default="", help="semicolon-separated scenario titles to run (default: all)")
    parser.add_argument("--factors", default="", help="only one static scenario of these slowdowns ('custom')")
    parser.add_argument("--throttle", choices=["sleep", "cfs"], default="cfs", help="with --factors")
    parser.add_argument("--compute", choices=["sleep", "spin"], default="spin", help="with --factors")
    parser.add_argument("--cost-s", type=float, default=0.001, help="emulated compute per sample at factor 1")
    parser.add_argument("--out", type=Path, default=RESULTS / "controller.json")


def grid_axes(args: argparse.Namespace) -> dict[str, list[Cell] | str]:
    """From the custom scenario of ``--factors`` (default ``1,4``: one rank at a quarter of the other's speed)."""
    args.factors = args.factors or "1,4"
    factors = [float(f) for f in args.factors.split(",")]
    kinds = {("sleep", "sleep"): "sleep", ("cfs", "sleep"): "cfs quota, slept compute", ("cfs", "spin"): "cfs quota"}
    slow = max(factors)
    four = ",".join(f"{f:g}" for f in ([2, 2, 2, 8] if args.compute == "spin" else [1, 2, 2, 4]))
    two = "1,4" if len(factors) != 2 else "1,4,4,4"
    return {
        "emulation": [
            Cell("emulation", label, {"throttle": throttle, "compute": compute})
            for (throttle, compute), label in kinds.items()
            if (throttle, compute) != (args.throttle, args.compute)
        ],
        "cost": [Cell("cost", f"x{k:g}", {"cost_s": args.cost_s * k}) for k in (0.5, 2)],
        "epoch": [Cell("epoch", f"x{k:g}", {"steps": round(args.steps * k)}) for k in (0.25, 4)],
        "workers": [Cell("workers", f"{len((four if len(factors) == 2 else two).split(','))} ranks",
                         {"factors": four if len(factors) == 2 else two})],
        "quota": [
            Cell("quota", f"slow rank 1/{k:g}", {"factors": ",".join(f"{k if f == slow else f:g}" for f in factors)})
            for k in (2, 8)
            if k != slow
        ],
    }  # fmt: skip


def figures(payload: dict) -> dict[str, float]:
    """Each scenario's fraction of the best static split."""
    return {r["title"]: r["fraction_of_best_static"] for r in payload["scenarios"] if "fraction_of_best_static" in r}


def main(args: argparse.Namespace) -> None:
    # (title, scenario, its name, factors, throttle, compute, options); "cfs cpu, 4 ranks": quotas summing to 1.6
    # CPUs (4 CPU-bound ranks at full speed would oversubscribe the 2 cores)
    plan: list[tuple] = [
        (f"sleep {k}, 2 ranks", static_scenario, k, f, "sleep", "sleep", {}) for k, f in TWO_RANKS.items()
    ]
    plan += [
        ("cfs 1/4, 2 ranks", static_scenario, "cfs 1/4", [1.0, 4.0], "cfs", "sleep", {}),
        ("cfs cpu 1/4, 2 ranks", static_scenario, "cfs cpu 1/4", [1.0, 4.0], "cfs", "spin", {}),
    ]
    for title, throttle, compute in (("flip HL4", "sleep", "sleep"), ("flip cfs 1/4", "cfs", "sleep"),
                                     ("flip cfs cpu 1/4", "cfs", "spin")):  # fmt: skip
        name = f"{title}, default cadence"
        plan.append((f"{name}, 2 ranks", flip_scenario, name, [1.0, 4.0], throttle, compute, {"default_cadence": True}))
    plan += [
        ("homogeneous, 2 ranks", None, "homogeneous", [1.0, 1.0], "sleep", "sleep", {}),
        ("first epoch HL4, 2 ranks", first_epoch_scenario, "first epoch HL4", [1.0, 4.0], "sleep", "sleep", {}),
        ("first epoch cfs cpu 1/4, 2 ranks", first_epoch_scenario, "first epoch cfs cpu 1/4", [1.0, 4.0], "cfs",
         "spin", {}),
    ]  # fmt: skip
    plan += [(f"sleep {k}, 4 ranks", static_scenario, k, f, "sleep", "sleep", {}) for k, f in FOUR_RANKS.items()]
    plan += [
        ("cfs, 4 ranks", static_scenario, "cfs 1,1/2,1/2,1/4", [1.0, 2.0, 2.0, 4.0], "cfs", "sleep", {}),
        ("cfs cpu, 4 ranks", static_scenario, "cfs cpu 1/2,1/2,1/2,1/8", [2.0, 2.0, 2.0, 8.0], "cfs", "spin", {}),
        ("flip HL4, 4 ranks", flip_scenario, "flip HL4", FOUR_RANKS["HL4"], "sleep", "sleep", {}),
    ]
    if args.factors:
        name = f"custom {args.throttle} {args.compute} {args.factors}"
        factors = [float(f) for f in args.factors.split(",")]
        plan.insert(0, ("custom", static_scenario, name, factors, args.throttle, args.compute, {}))
        args.only = "custom"
    only = {name.strip() for name in args.only.split(";") if name.strip()}
    results: list[dict] = []
    for title, scenario, name, factors, throttle, compute, options in plan:
        if only and title not in only:
            continue
        t0 = time.time()
        if scenario is None:
            row = homogeneous_scenario(args)
        else:
            row = scenario(name, factors, throttle, args, compute, **options)
        row["title"] = title
        row["wall_s"] = time.time() - t0
        results.append(row)
        print(f"{title}: done in {row['wall_s']:.0f} s", flush=True)
        conditions = {"global_batch": GLOBAL_BATCH, "adjust_every_n_steps": PERIOD}
        # after every scenario, so that a long run leaves its results so far
        write_json(args.out, {"conditions": conditions, "scenarios": results}, quiet=True)
    print_table(args, results)
    print(f"\nwrote {args.out}")
