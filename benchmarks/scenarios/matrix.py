"""The comparison matrix: {plain DDP, HeteroBatch BSP, ASP, Sync-Switch hybrid} x {HL1, HL2, HL4, HL8} x {2, 4} ranks.

Every configuration trains the same small model on the same generated data for the same number of epochs, in its
own processes (``benchmarks/matrix_worker.py``; Lightning's launcher starts the other ranks), with emulated
heterogeneity: a per-sample compute cost slept in ``training_step`` on every rank (so that the real CPU work, which
four processes share on this 2-core host, stays small against it) and ``SlowdownEmulator`` stretching rank k's compute
by its factor.

Heterogeneity levels come from OmniLearn's BSP table (cores per worker on a 48-core host, see
``lightning_hetero.emulation.presets.OMNILEARN_CORES``): with 4 ranks, factor_k = max cores / cores_k (HL8: 6, 6, 4, 32
cores -> factors 5.33, 5.33, 8, 1); with 2 ranks, the table's fastest and slowest worker (HL8: 32 and 4 cores -> 1 and
8), which keeps HL = max / min cores. Ranks are ordered fastest first, so rank 0 (which hosts ASP's parameter server)
is the fastest machine, as OmniLearn gave its server its own cores.

Epoch 0 is an untimed warm-up in every configuration (process start-up, HeteroBatch's first adjustments, and a
first-step artefact: ``SlowdownEmulator`` guesses the first backward from the first forward, which in ASP can hold
~0.2 s of one-off set-up, and stretches both by 2 x (factor - 1)). The hybrid trains BSP in the warm-up epoch and the
first timed epoch, then ASP: a 25% BSP share of the timed epochs. Measured per configuration over the timed epochs
(rank clocks on one host): training time = the sum over epochs of (latest last-batch end - earliest epoch start)
across ranks, validation excluded; throughput = training samples / training time; the median of per-epoch
throughputs; validation accuracy after each epoch; real CPU seconds and slept seconds per rank (the emulation check).
Plain DDP at the same HL and rank count is the reference for "vs DDP" and for the accuracy target (its final accuracy
- 0.5 point).

Usage:
    python -m benchmarks run matrix                # the full matrix, ~10 minutes on 2 cores
    python -m benchmarks run matrix --quick        # HL1 and HL8, 2 ranks, 3 short epochs (~2 minutes)
    python -m benchmarks run matrix --replot       # table and plots again from the JSON, without training
    python -m benchmarks run matrix --out benchmarks/results/matrix.json   # replace the committed results

Writes ``benchmarks/results/local/matrix.json`` (``matrix_quick.json`` with ``--quick``; the folder is not tracked by
git, so a run never overwrites the committed ``benchmarks/results/matrix.json`` unless ``--out`` names it) and, when
matplotlib is installed (``pip install -e ".[plots]"``), ``<out stem>_throughput.png``, ``_batch_sizes.png`` and
``_accuracy.png`` beside it. Without matplotlib the plots are skipped with a note (said at the start, before the long
run); the JSON and table are written.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness.launch import RESULTS, child_env, module_command, read_reports, run_job
from lightning_hetero.emulation.presets import OMNILEARN_CORES

METHODS = ("ddp", "hetero", "asp", "hybrid")
METHOD_NAMES = {
    "ddp": "plain DDP",
    "hetero": "HeteroBatch BSP",
    "asp": "ASP (AsyncPSStrategy)",
    "hybrid": "Sync-Switch hybrid",
}
LEVELS = ("HL1", "HL2", "HL4", "HL8")
RANKS = (2, 4)
TARGET_MARGIN = 0.005


def hl_factors(level: str, ranks: int) -> list[float]:
    """Slowdown factors, fastest rank first, for an OmniLearn heterogeneity level on 2 or 4 ranks.

    Example::

        >>> hl_factors("HL8", 4)
        [1.0, 5.3333, 5.3333, 8.0]
        >>> hl_factors("HL4", 2)
        [1.0, 4.0]
    """
    table = OMNILEARN_CORES["bsp"]
    if level not in table:
        raise ValueError(f"unknown level {level!r} (known: {', '.join(table)})")
    cores = sorted(table[level], reverse=True)
    if ranks == 2:
        cores = [cores[0], cores[-1]]
    elif ranks != len(cores):
        raise ValueError(f"ranks must be 2 or {len(cores)}, got {ranks}")
    return [round(cores[0] / c, 4) for c in cores]


def emulated_bound(factors: Sequence[float], cost_s: float) -> float:
    """Samples/s if every rank worked all the time at its emulated speed and nothing else cost time (computed)."""
    return sum(1.0 / (f * cost_s) for f in factors)


def summarise(reports: Sequence[dict[str, Any]], warmup_epochs: int = 1) -> dict[str, Any]:
    """One configuration's measurements from its ranks' reports (``matrix_worker.py`` output).

    The first ``warmup_epochs`` epochs are trained but not timed; the accuracy curve starts at 0 s with the accuracy
    after them.
    """
    reports = sorted(reports, key=lambda r: r["rank"])
    epochs = []
    for index in range(min(len(r["epochs"]) for r in reports)):
        per_rank = [r["epochs"][index] for r in reports]
        start, end = min(e["start"] for e in per_rank), max(e["end"] for e in per_rank)
        samples = sum(e["samples"] for e in per_rank)
        epochs.append(
            {
                "epoch": index,
                "warmup": index < warmup_epochs,
                "mode": per_rank[0]["mode"],
                "train_s": end - start,
                "samples": samples,
                "samples_per_s": samples / (end - start),
                "val_acc": per_rank[0].get("val_acc"),
                "steps_per_rank": [e["steps"] for e in per_rank],
            }
        )
    measured = epochs[warmup_epochs:]
    if not measured:
        raise ValueError(f"no epochs after the {warmup_epochs} warm-up epoch(s)")
    train_s = sum(e["train_s"] for e in measured)
    elapsed = 0.0
    curve = [[0.0, epochs[warmup_epochs - 1]["val_acc"]]] if warmup_epochs else []
    for epoch in measured:
        elapsed += epoch["train_s"]
        curve.append([round(elapsed, 3), epoch["val_acc"]])
    cpu_s = [sum(e["cpu_s"] for e in r["epochs"]) for r in reports]
    timed_cpu_s = [sum(e["cpu_s"] for e in r["epochs"][warmup_epochs:]) for r in reports]
    slept_s = [r["slept_s"] for r in reports]
    fit_start = min(r["epochs"][0]["start"] for r in reports)
    first = reports[0]
    return {
        "train_s": train_s,
        "warmup_train_s": sum(e["train_s"] for e in epochs[:warmup_epochs]),
        "samples": sum(e["samples"] for e in measured),
        "samples_per_s": sum(e["samples"] for e in measured) / train_s,
        "median_epoch_samples_per_s": statistics.median(e["samples_per_s"] for e in measured),
        "final_acc": epochs[-1]["val_acc"],
        "accuracy_curve": curve,
        "epochs": epochs,
        "cpu_s_per_rank": cpu_s,
        "slept_s_per_rank": slept_s,
        "real_share_max": max(c / (c + s) for c, s in zip(cpu_s, slept_s, strict=True)),
        "cores_busy": sum(timed_cpu_s) / train_s,
        "first_step_stretch_s_max": max(max(r.get("first_stretches_s") or [0.0]) for r in reports),
        "updates": first["global_step"],
        "final_split": first.get("final_split"),
        "adjustments": None if first.get("hetero_history") is None else len(first["hetero_history"]),
        "server_summary": first.get("server_summary"),
        "switches": first.get("switches"),
        "timed_from_s": min(r["epochs"][warmup_epochs]["start"] for r in reports) - fit_start,
        "batch_sizes": [[[round(t - fit_start, 3), b] for t, b in r["steps"]] for r in reports]
        if first.get("hetero_history") is not None
        else None,
    }


def time_to(curve: Sequence[Sequence[float]], target: float) -> float | None:
    """Training seconds until the validation accuracy first reaches ``target`` (None: never)."""
    return next((t for t, acc in curve if acc is not None and acc >= target), None)


def compare(rows: list[dict[str, Any]]) -> None:
    """Adds, in place, each row's ratios to plain DDP at the same level and rank count."""
    reference = {(r["level"], r["ranks"]): r for r in rows if r["method"] == "ddp" and r["status"] == "ok"}
    for row in rows:
        ddp = reference.get((row["level"], row["ranks"]))
        if row["status"] != "ok" or ddp is None:
            continue
        target = ddp["final_acc"] - TARGET_MARGIN
        row["target_acc"] = target
        row["time_to_target_s"] = time_to(row["accuracy_curve"], target)
        row["speedup_vs_ddp"] = ddp["train_s"] / row["train_s"]
        row["time_saved_vs_ddp_pct"] = 100.0 * (1.0 - row["train_s"] / ddp["train_s"])
        row["acc_minus_ddp_points"] = 100.0 * (row["final_acc"] - ddp["final_acc"])


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The summary table, one line per configuration."""
    header = (
        f"{'ranks':>5} {'HL':<4} {'method':<22} {'status':<7} {'train s':>8} {'samples/s':>9} {'median':>7} "
        f"{'bound':>6} {'vs DDP':>7} {'saved':>6} {'acc':>6} {'-DDP pt':>7} {'to tgt s':>8} {'real%':>5} {'cores':>5}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        head = f"{r['ranks']:>5} {r['level']:<4} {METHOD_NAMES[r['method']]:<22} {r['status']:<7}"
        if r["status"] != "ok":
            lines.append(f"{head} {r.get('error', '').splitlines()[-1][:80] if r.get('error') else ''}")
            continue
        tgt = r.get("time_to_target_s")

        def opt(key: str, fmt: str, row: dict[str, Any] = r) -> str:
            return format(row[key], fmt) if row.get(key) is not None else "-"

        lines.append(
            f"{head} {r['train_s']:>8.1f} {r['samples_per_s']:>9.0f} {r['median_epoch_samples_per_s']:>7.0f} "
            f"{r['bound_samples_per_s']:>6.0f} {opt('speedup_vs_ddp', '.2f'):>6}x {opt('time_saved_vs_ddp_pct', '.0f'):>5}% "
            f"{r['final_acc']:>6.3f} {opt('acc_minus_ddp_points', '+.1f'):>7} "
            f"{'never' if tgt is None and 'target_acc' in r else opt('time_to_target_s', '.1f'):>8} "
            f"{100 * r['real_share_max']:>5.1f} {r['cores_busy']:>5.2f}"
        )
    return "\n".join(lines)


def run_config(method: str, level: str, ranks: int, args: argparse.Namespace) -> dict[str, Any]:
    """Train one configuration in fresh processes; a failure or timeout is recorded, not raised."""
    factors = hl_factors(level, ranks)
    row: dict[str, Any] = {"method": method, "level": level, "ranks": ranks, "factors": factors}
    row["bound_samples_per_s"] = emulated_bound(factors, args.cost_s)
    started = time.time()
    with tempfile.TemporaryDirectory() as out:
        command = [*module_command("matrix_worker"), out, "--method", method, "--factors", ",".join(map(str, factors))]
        for key in (
            "cost_s",
            "samples",
            "batch_size",
            "epochs",
            "lr",
            "adjust_every",
            "hybrid_schedule",
            "hybrid_asp_lr_scale",
            "hybrid_asp_momentum_ramp",
        ):
            command += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
        env = child_env(drop=("MASTER_PORT", "MASTER_ADDR"), PYTHONWARNINGS="ignore")
        try:
            run_job(command, args.timeout_s, env)
            row.update(status="ok", **summarise(read_reports(Path(out), ranks)))
        except (RuntimeError, OSError) as error:  # a failure or timeout is recorded, not raised
            row["status"] = "timeout" if "ran past" in str(error).splitlines()[0] else "failed"
            row["error"] = str(error)[-3000:].strip()
        row["wall_s"] = time.time() - started
    return row


def conditions(args: argparse.Namespace, wall_s: float, load: tuple[float, ...]) -> dict[str, Any]:
    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    factors = {f"{level} x{ranks}": hl_factors(level, ranks) for ranks in args.ranks for level in args.levels}
    return {
        "machine": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_before": load,
        "load_average_after": os.getloadavg(),
        "python": platform.python_version(),
        "versions": {name: version(name) for name in ("torch", "lightning", "lightning-hetero", "matplotlib")},
        "model": f"MLP 32-128-128-10 (22k parameters), SGD lr {args.lr:g} momentum 0.9, 1 torch thread per process",
        "data": f"make_classification: {args.samples} training + 1024 validation samples, 32 features, 10 classes, "
        "noise 2.5, seed 0",
        "steps": f"{args.epochs} epochs of {args.samples} samples; batch {args.batch_size} per rank (DDP and "
        f"HeteroBatch: global batch {args.batch_size} x ranks, HeteroBatch re-splits it every {args.adjust_every} "
        f"steps; ASP: every update is one {args.batch_size}-sample batch)",
        "methods": {
            "ddp": "DDPStrategy (gloo), equal batches",
            "hetero": f"DDPStrategy + HeteroBatchCallback(adjust_every_n_steps={args.adjust_every}, warmup_steps=2)",
            "asp": "AsyncPSStrategy(mode='asp'), server threads in rank 0, no staleness bound",
            "hybrid": f"AsyncPSStrategy(mode='bsp') + SyncSwitchCallback('{args.hybrid_schedule}', "
            f"hyperparams={{'asp': PhaseHyperparams(lr_scale={args.hybrid_asp_lr_scale:g}, "
            f"momentum_ramp_steps={args.hybrid_asp_momentum_ramp})}})",
        },
        "emulation": {
            "cost_s_per_sample": args.cost_s,
            "rule": "sleep cost_s x batch in training_step on every rank, then SlowdownEmulator(factors) stretches "
            "rank k's compute (batch start to end of backward) by factor_k; factors from OmniLearn's BSP table: "
            "4 ranks max_cores/cores_k, 2 ranks the fastest and slowest worker; fastest rank first",
            "factors": factors,
        },
        "statistics": "epoch 0 is an untimed warm-up; train_s = sum over the other epochs of (latest last-batch end "
        "- earliest epoch start), validation excluded; samples_per_s = samples / train_s; median = median per-epoch samples/s; "
        "bound = sum_k 1/(factor_k x cost_s) (computed, not measured); real% = max over ranks of CPU s / (CPU s + "
        "slept s), all epochs; cores = sum of ranks' CPU s / train_s; target = plain DDP's final accuracy - 0.5 point",
        "timeout_s_per_config": args.timeout_s,
        "wall_s": round(wall_s, 1),
    }


def plot(report: dict[str, Any], out: Path) -> list[Path]:
    """Throughput per configuration, HeteroBatch's per-rank batch sizes over time, accuracy against time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["rows"] if r["status"] == "ok"]
    ranks = sorted({r["ranks"] for r in report["rows"]})
    levels = [level for level in LEVELS if any(r["level"] == level for r in report["rows"])]
    methods = [m for m in METHODS if any(r["method"] == m for r in report["rows"])]
    find = {(r["method"], r["level"], r["ranks"]): r for r in rows}
    colours = {"ddp": "tab:gray", "hetero": "tab:blue", "asp": "tab:orange", "hybrid": "tab:green"}
    stem = out.with_suffix("")
    paths = []

    fig, axes = plt.subplots(1, len(ranks), figsize=(6 * len(ranks), 4), squeeze=False)
    width = 0.8 / len(methods)
    for ax, n in zip(axes[0], ranks, strict=True):
        for i, method in enumerate(methods):
            xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(levels))]
            ys = [find[(method, lv, n)]["samples_per_s"] if (method, lv, n) in find else 0 for lv in levels]
            ax.bar(xs, ys, width, label=METHOD_NAMES[method], color=colours[method])
        bounds = [
            emulated_bound(hl_factors(lv, n), report["conditions"]["emulation"]["cost_s_per_sample"]) for lv in levels
        ]
        ax.scatter(range(len(levels)), bounds, marker="_", s=900, color="black", label="emulated bound (computed)")
        ax.set_xticks(range(len(levels)), levels)
        ax.set_title(f"{n} ranks: training samples/s (timed epochs)")
        ax.set_ylim(0, 1.25 * max(bounds))
        ax.set_ylabel("samples/s")
    axes[0][0].legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    paths.append(Path(f"{stem}_throughput.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    for kind in ("batch_sizes", "accuracy"):
        fig, axes = plt.subplots(len(ranks), len(levels), figsize=(3.6 * len(levels), 3 * len(ranks)), squeeze=False)
        for row_axes, n in zip(axes, ranks, strict=True):
            for ax, lv in zip(row_axes, levels, strict=True):
                ax.set_title(f"{lv}, {n} ranks", fontsize=9)
                if kind == "batch_sizes":
                    row = find.get(("hetero", lv, n))
                    for k, steps in enumerate((row or {}).get("batch_sizes") or []):
                        ax.step([t for t, _ in steps], [b for _, b in steps], where="post",
                                label=f"rank {k} (x{row['factors'][k]:g})")  # fmt: skip
                    if row:
                        ax.axvline(row["timed_from_s"], color="black", linestyle=":", linewidth=1)
                    ax.set_xlabel("time since the warm-up epoch began (s)", fontsize=8)
                    ax.set_ylabel("local batch size", fontsize=8)
                    if row:
                        ax.legend(fontsize=7)
                else:
                    for method in methods:
                        row = find.get((method, lv, n))
                        if row:
                            curve = row["accuracy_curve"]
                            ax.plot([t for t, _ in curve], [a for _, a in curve], marker="o", markersize=3,
                                    label=METHOD_NAMES[method], color=colours[method])  # fmt: skip
                    ax.set_xlabel("training time after the warm-up epoch (s)", fontsize=8)
                    ax.set_ylabel("validation accuracy", fontsize=8)
        if kind == "accuracy":
            axes[0][0].legend(fontsize=7)
        title = (
            "HeteroBatch: per-rank batch size over time (dotted: end of the warm-up epoch)"
            if kind == "batch_sizes"
            else "validation accuracy against training time"
        )
        fig.suptitle(title)
        fig.tight_layout()
        paths.append(Path(f"{stem}_{kind}.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def write_outputs(report: dict[str, Any], out: Path, plots: bool) -> None:
    print()
    print(format_table(report["rows"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {out}")
    if plots:
        for path in plot(report, out):
            print(f"wrote {path}")
    else:
        print("plots skipped: matplotlib is not installed (pip install -e '.[plots]'); JSON and table written")


def default_out(quick: bool) -> Path:
    """Where a run writes unless ``--out`` says otherwise: a folder git ignores, never the committed results."""
    return RESULTS / "local" / ("matrix_quick.json" if quick else "matrix.json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="HL1 and HL8 on 2 ranks, 3 epochs of 1024 samples")
    parser.add_argument("--replot", action="store_true", help="print the table and plot from --out; no training")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--levels", default=",".join(LEVELS))
    parser.add_argument("--ranks", default=",".join(map(str, RANKS)))
    parser.add_argument("--epochs", type=int, default=5, help="including the untimed warm-up epoch")
    parser.add_argument("--samples", type=int, default=3072, help="training samples per epoch")
    parser.add_argument("--batch-size", type=int, default=64, help="per-rank batch")
    parser.add_argument("--cost-s", type=float, default=0.0005, help="emulated compute per sample at factor 1")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--adjust-every", type=int, default=4, help="HeteroBatch: re-split every n steps")
    parser.add_argument(
        "--hybrid-schedule", default="bsp:0-1,asp:2-", help="hybrid: BSP for the warm-up epoch and 1 of the 4 timed"
    )
    parser.add_argument("--hybrid-asp-lr-scale", type=float, default=1.0, help="hybrid: LR scale in its ASP phase")
    parser.add_argument("--hybrid-asp-momentum-ramp", type=int, default=0, help="hybrid: momentum ramp steps in ASP")
    parser.add_argument("--timeout-s", type=float, default=240.0, help="per configuration")
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON path (default benchmarks/results/local/matrix[_quick].json)"
    )


def main(args: argparse.Namespace) -> None:
    if args.quick:
        args.levels, args.ranks, args.epochs, args.samples = "HL1,HL8", "2", 3, 1024
        args.hybrid_schedule = "bsp:0-1,asp:2-"
    out = args.out or default_out(args.quick)
    plots = importlib.util.find_spec("matplotlib") is not None
    if not plots:
        print("note: matplotlib is not installed (pip install -e '.[plots]'): the plots will be skipped")
    if args.replot:
        write_outputs(json.loads(out.read_text()), out, plots)
        return
    args.methods, args.levels = args.methods.split(","), args.levels.split(",")
    args.ranks = [int(n) for n in args.ranks.split(",")]
    for method in args.methods:
        if method not in METHODS:
            raise SystemExit(f"error: --methods: unknown method {method!r} (known: {', '.join(METHODS)})")
    for ranks in args.ranks:
        for level in args.levels:
            hl_factors(level, ranks)  # fails here, naming the bad value, rather than mid-run

    configs = [(m, lv, n) for n in args.ranks for lv in args.levels for m in args.methods]
    load, started, rows = os.getloadavg(), time.time(), []
    print(
        f"{len(configs)} configurations, each in its own processes (per-configuration timeout {args.timeout_s:.0f} s)"
    )
    for i, (method, level, ranks) in enumerate(configs, 1):
        row = run_config(method, level, ranks, args)
        rows.append(row)
        detail = (
            f"{row['samples_per_s']:7.0f} samples/s, acc {row['final_acc']:.3f}"
            if row["status"] == "ok"
            else row["status"].upper()
        )
        print(
            f"[{i:2d}/{len(configs)}] {METHOD_NAMES[method]:<22} {level} {ranks} ranks: {detail} "
            f"({row['wall_s']:.1f} s; elapsed {time.time() - started:.0f} s)",
            flush=True,
        )
    compare(rows)
    report = {"conditions": conditions(args, time.time() - started, load), "rows": rows}
    write_outputs(report, out, plots)
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        print(f"{len(failed)} configuration(s) did not finish; their errors are in the JSON")
    print(f"matrix wall time {time.time() - started:.0f} s")
