"""Draw the docs' figures (docs/figures/*.png) from committed JSON, so they can be redrawn at any time.

Sources: ``docs/figures/data/demo.json`` (one run of ``make demo``, copied from ``demo_output/demo.json``) and the
benchmark results in ``benchmarks/results/`` (read only). ``make docs`` runs this script before Sphinx.

Usage: ``python scripts/draw_figures.py [--out docs/figures]``; needs matplotlib (the ``plots`` extra, in ``dev``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DEMO_JSON = REPO / "docs" / "figures" / "data" / "demo.json"

# One JSON per feature's headline figure (the rows of docs/results.md that name them).
ASP_ACCURACY = RESULTS / "asp_accuracy_merged_0ac8bd8.json"
HYBRID_ACCURACY = RESULTS / "asp_accuracy_issue25e_hybrid.json"
LOCAL_SGD = RESULTS / "local_sgd_classes256_4w_heavy_hl4_deadline.json"
ELASTIC = {"sleep": RESULTS / "elastic_28b.json", "CPU quota": RESULTS / "elastic_28g_quota.json"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    # No timestamps or software versions in the file, so a redraw from the same JSON changes nothing in git.
    fig.savefig(path, dpi=110, metadata={"Software": None})
    fig.clf()


def draw_demo(out: Path) -> list[Path]:
    """The demo's two plots (throughput, and each rank's batch size over time), drawn by the demo's own code."""
    sys.path.insert(0, str(REPO))
    from examples import demo

    results = json.loads(DEMO_JSON.read_text())
    throughput, batch_sizes = out / "demo_throughput.png", out / "demo_batch_sizes.png"
    demo.plot(results, throughput)
    demo.plot_batch_sizes(results, batch_sizes)
    return [throughput, batch_sizes]


def _rows(path: Path, config: str) -> list[dict]:
    return sorted(
        (row for row in json.loads(path.read_text())["rows"] if row["config"] == config), key=lambda r: r["workers"]
    )


def draw_asp(out: Path) -> Path:
    """ASP against BSP with BSP's hyper-parameters: accuracy difference and throughput ratio at 2, 4 and 8 workers."""
    plt = _pyplot()
    rows = _rows(ASP_ACCURACY, "asp")
    workers = [str(row["workers"]) for row in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(7.5, 3.2))
    left.bar(
        workers,
        [row["acc_vs_bsp_points"] for row in rows],
        yerr=[row["acc_vs_bsp_points_sd"] for row in rows],
        color="C0",
        capsize=4,
    )
    left.axhline(0, color="grey", linewidth=1)
    left.set_xlabel("workers (HL4)")
    left.set_ylabel("accuracy minus BSP's (points)")
    right.bar(workers, [1 / row["time_vs_bsp"] for row in rows], color="C2")
    right.axhline(1, color="grey", linewidth=1, linestyle="--")
    right.set_xlabel("workers (HL4)")
    right.set_ylabel("throughput, x BSP's")
    fig.suptitle("AsyncPSStrategy(mode='asp') with its defaults vs BSP, 3 seeds", fontsize="medium")
    path = out / "asp_vs_bsp.png"
    _save(fig, path)
    return path


def _mean_curve(runs: list[dict], config: str, workers: int) -> tuple[list[float], list[float]]:
    """Mean accuracy after each epoch over seeds, placed at the mean training time of that many epochs."""
    chosen = [run for run in runs if run["config"] == config and run["workers"] == workers]
    epochs = len(chosen[0]["acc_per_epoch"])
    seconds = statistics.mean(run["train_s"] for run in chosen)
    xs = [seconds * (epoch + 1) / epochs for epoch in range(epochs)]
    ys = [statistics.mean(run["acc_per_epoch"][epoch] for run in chosen) for epoch in range(epochs)]
    return xs, ys


def draw_sync_switch(out: Path) -> Path:
    """The default hybrid (BSP first, then compensated ASP) against BSP: accuracy against training time."""
    plt = _pyplot()
    runs = json.loads(HYBRID_ACCURACY.read_text())["runs"]
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    for config, label, color in (("bsp", "BSP", "C0"), ("hybrid", "hybrid: BSP, then ASP", "C3")):
        xs, ys = _mean_curve(runs, config, 4)
        ax.plot(xs, ys, "o-", color=color, label=label)
    ax.set_xlabel("training time (s; epochs placed evenly over each run)")
    ax.set_ylabel("validation accuracy")
    ax.set_title("SyncSwitchCallback vs BSP, 4 workers, HL4, mean of 3 seeds", fontsize="medium")
    ax.legend(loc="lower right", fontsize="small")
    path = out / "sync_switch_vs_bsp.png"
    _save(fig, path)
    return path


def draw_local_sgd(out: Path) -> Path:
    """Local SGD against DDP: validation accuracy against wall time, one seed (seed 0) of the headline cell."""
    plt = _pyplot()
    runs = json.loads(LOCAL_SGD.read_text())["runs"]
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    for config, label, color in (("ddp", "DDP", "C0"), ("local_prop", "local SGD (defaults)", "C2")):
        run = next(run for run in runs if run["config"] == config and run["seed"] == 0)
        ax.plot([t for t, _ in run["curve"]], [acc for _, acc in run["curve"]], ".-", color=color, label=label)
    ax.set_xlabel("seconds of training")
    ax.set_ylabel("validation accuracy")
    ax.set_title("AsyncPSStrategy(mode='local') vs DDP, 4 workers, HL4, seed 0", fontsize="medium")
    ax.legend(loc="lower right", fontsize="small")
    path = out / "local_sgd_vs_ddp.png"
    _save(fig, path)
    return path


def draw_elastic(out: Path) -> Path:
    """Elastic local SGD: throughput of a job with a worker killed and restarted every epoch, over the same job
    undisturbed, with speeds by sleep and by CPU quota."""
    plt = _pyplot()
    labels, ratios, notes = [], [], []
    for name, path in ELASTIC.items():
        summary = json.loads(path.read_text())["summary"]
        churn = summary["churn"]
        labels.append(name)
        ratios.append(churn["samples_per_s"] / summary["undisturbed"]["samples_per_s"])
        notes.append(f"{churn['lost']} lost, {churn['duplicated']} duplicated")
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    bars = ax.bar(labels, ratios, color="C4", width=0.5)
    for bar, note in zip(bars, notes, strict=True):
        ax.annotate(
            note, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize="small"
        )
    ax.axhline(1, color="grey", linewidth=1, linestyle="--")
    ax.set_ylim(0, 1.2)
    ax.set_ylabel("throughput under churn,\nx the undisturbed job's")
    ax.set_title("ElasticLocalSGDStrategy, 4 workers: one killed and restarted each epoch", fontsize="medium")
    path = out / "elastic_churn.png"
    _save(fig, path)
    return path


def draw_all(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    return [*draw_demo(out), draw_asp(out), draw_sync_switch(out), draw_local_sgd(out), draw_elastic(out)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "figures", help="folder for the PNGs")
    args = parser.parse_args()
    for path in draw_all(args.out):
        print(f"drew {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
