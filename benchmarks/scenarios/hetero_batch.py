"""HeteroBatchCallback against plain DDP on 2 CPU ranks, one slowed 4x, and with equal ranks.
The ideal is the sum of each rank alone; then the steps to recover when the slow rank changes mid-run.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from benchmarks.harness.grid import Cell
from benchmarks.harness.launch import RESULTS, child_env, module_command, run_json
from benchmarks.harness.models import flags
from benchmarks.harness.record import table, write_json


def run(method: str, factors: str, cost_s: float, epochs: int = 4, **extra: object) -> dict:
    def command(out: Path) -> list[str]:
        settings = flags(method=method, factors=factors, cost_s=cost_s, epochs=epochs, **extra)
        return module_command("hetero_batch_worker", out, *settings)

    return run_json(command, timeout_s=600, env=child_env(PYTHONWARNINGS="ignore"))


def step_throughputs(result: dict) -> list[float]:
    times, sizes = result["times"], result["global_sizes"]
    return [sizes[i] / (times[i] - times[i - 1]) for i in range(1, len(times))]


def steady_median(result: dict, steps_per_epoch: int) -> float:
    return statistics.median(step_throughputs(result)[steps_per_epoch:])


def recovery_steps(result: dict, switch_step: int, ideal: float, window: int = 4) -> int | None:
    """Steps after the switch until a ``window``-step median throughput first reaches 90% of ideal."""
    rates = step_throughputs(result)
    for start in range(switch_step, len(rates) - window + 1):
        if statistics.median(rates[start : start + window]) >= 0.9 * ideal:
            return start - switch_step + 1
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cost-s", type=float, default=0.0003, help="emulated compute per sample at factor 1")
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--adjust-every", type=int, default=8)
    parser.add_argument("--defaults", action="store_true", help="HeteroBatchCallback() at its defaults")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats; medians are reported")
    parser.add_argument("--out", type=Path, default=RESULTS / "hetero_batch.json")


def grid_axes(args: argparse.Namespace) -> dict[str, list[Cell] | str]:
    """From the command line's point: HeteroBatch over the ideal with one rank 4x slower."""
    return {
        "emulation": "sleeps only (the worker has no quota); the controller scenario's grid covers quotas",
        "cost": [Cell("cost", f"x{k:g}", {"cost_s": args.cost_s * k}) for k in (0.5, 2)],
        "epoch": [Cell("epoch", f"x{k:g}", {"samples": round(args.samples * k)}) for k in (0.25, 4)],
        "workers": "two ranks only (the slow rank's swap is defined for two)",
        "quota": "sleeps only",
    }


def figures(payload: dict) -> dict[str, float]:
    return {"HeteroBatch / ideal, one rank 4x slower": payload["ratios"]["hetero_vs_ideal"]}


def main(args: argparse.Namespace) -> None:
    if args.defaults:
        args.adjust_every = 0  # the worker's HeteroBatchCallback() with every setting at its default
    cost, batch = args.cost_s, 32
    steps_per_epoch = args.samples // (2 * batch)
    common = {"samples": args.samples}

    configs = [
        ("DDP, rank 1 slowed 4x", "ddp", "1,4"),
        ("HeteroBatch, rank 1 slowed 4x", "hetero", "1,4"),
        ("DDP, equal ranks", "ddp", "1,1"),
        ("HeteroBatch, equal ranks", "hetero", "1,1"),
    ]
    samples: dict[str, list[float]] = {"alone 1": [], "alone 4": [], **{name: [] for name, _, _ in configs}}
    splits: dict[str, list[int] | None] = {}
    # Repeats interleave the configurations, so a change in background load hits all of them alike.
    for _ in range(args.repeats):
        samples["alone 1"].append(steady_median(run("single", "1", cost, **common, batch=batch), steps_per_epoch))
        samples["alone 4"].append(steady_median(run("single", "4", cost, **common, batch=batch), steps_per_epoch))
        for name, method, factors in configs:
            result = run(method, factors, cost, **common, adjust_every=args.adjust_every)
            samples[name].append(steady_median(result, steps_per_epoch))
            splits[name] = result.get("final_split")
    fast_alone = statistics.median(samples["alone 1"])
    slow_alone = statistics.median(samples["alone 4"])
    ideal = fast_alone + slow_alone
    rows = [(name, statistics.median(samples[name]), splits[name]) for name, _, _ in configs]

    # The slow rank changes two steps after an adjustment, the least favourable moment.
    switch_step = 3 * steps_per_epoch // 2 + 2
    flip = {"factors_after": "4,1", "switch_step": switch_step}
    dynamic = run("hetero", "1,4", cost, **common, adjust_every=args.adjust_every, **flip)
    recovery = recovery_steps(dynamic, switch_step, ideal)
    changes = [change["step"] for change in dynamic["history"]]
    adjustments_needed = None if recovery is None else sum(switch_step <= s < switch_step + recovery for s in changes)

    throughput = {name: value for name, value, _ in rows}
    hetero_ratio = throughput["HeteroBatch, rank 1 slowed 4x"] / ideal
    ddp_ratio = throughput["DDP, rank 1 slowed 4x"] / ideal
    equal_ratio = throughput["HeteroBatch, equal ranks"] / throughput["DDP, equal ranks"]
    print(f"\nHeteroBatch: {cost * 1e3:.2f} ms/sample at factor 1, global batch {2 * batch}, {args.samples} per epoch")
    cells = [["rank alone, factor 1", fast_alone, None, None], ["rank alone, factor 4", slow_alone, None, None],
             ["ideal (sum of the two)", ideal, 1.0, None], *([n, v, v / ideal, s] for n, v, s in rows)]  # fmt: skip
    print(table(["configuration", "samples/s (median)", "vs ideal", "final split"], cells, ["", ".0f", ".2f"]))
    print(f"\nHeteroBatch / ideal, one rank 4x slower: {hetero_ratio:.2f} (target >= 0.90); plain DDP: {ddp_ratio:.2f}")
    print(f"HeteroBatch / DDP, equal ranks: {equal_ratio:.3f} (target >= 0.97)")
    cadence = "adjusting with the defaults" if args.defaults else f"periods of {args.adjust_every} steps"
    periods = "" if recovery is None or args.defaults else f"{recovery / args.adjust_every:.2f} "
    print(
        f"after the slow rank changes at step {switch_step}: back within 10% of ideal after {recovery} steps "
        f"({periods}{cadence}; {adjustments_needed} adjustment(s) after the change)"
    )

    dynamic_result = {
        "switch_step": switch_step,
        "recovery_steps": recovery,
        "recovery_periods": periods,
        "adjustments_until_recovered": adjustments_needed,
        "history": dynamic["history"],
    }
    payload = {
        "conditions": {"cost_s_per_sample": cost, "global_batch": 2 * batch, "epochs": 4},
        "standalone": {"factor_1": fast_alone, "factor_4": slow_alone, "ideal": ideal},
        "throughput": throughput, "per_repeat": samples, "final_splits": {name: split for name, _, split in rows},
        "ratios": {"hetero_vs_ideal": hetero_ratio, "ddp_vs_ideal": ddp_ratio, "hetero_vs_ddp_equal": equal_ratio},
        "dynamic": dynamic_result,
    }  # fmt: skip
    write_json(args.out, payload, indent=2)
