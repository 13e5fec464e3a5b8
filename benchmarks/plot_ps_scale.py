"""Plot ``bench_ps_scale.py`` results: ASP throughput over the ideal per configuration and variant, from JSON files.

Each bar is a variant's median ``asp_over_ideal`` in one configuration (``WORKERSxMODELxSTEP_MS``), the whiskers
its smallest and largest repeat; a configuration measured in several files gets one bar per (file, variant). The
dashed line is the ideal (the sum of the workers' standalone throughputs); the dotted one the issue's 0.9 goal.

    python benchmarks/plot_ps_scale.py benchmarks/results/ps_scale_2w_quiet.json \\
        benchmarks/results/ps_scale_4w_quiet.json benchmarks/results/ps_scale_16w_quiet.json \\
        benchmarks/results/ps_scale_shards_4w.json --out benchmarks/results/ps_scale.png

Needs matplotlib (the ``plots`` extra).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def bars(results: list[dict[str, Any]]) -> list[tuple[str, str, float, float, float]]:
    """``(configuration, variant, median, smallest, largest)`` for every configuration and variant, in file order.

    Example::

        >>> result = {"summary": {"4x4.3Mx65": {"overlap": {"asp_over_ideal_median": 0.92,
        ...                                                "asp_over_ideal_each": [0.91, 0.92, 0.93]}}}}
        >>> bars([result])
        [('4x4.3Mx65', 'overlap', 0.92, 0.91, 0.93)]
    """
    rows = []
    for result in results:
        for config, variants in result["summary"].items():
            for label, figures in variants.items():
                each = figures["asp_over_ideal_each"]
                rows.append((config, label, figures["asp_over_ideal_median"], min(each), max(each)))
    return rows


def plot(results: list[dict[str, Any]], out: Path) -> Path:
    """Grouped bars per configuration, one per variant, with min-max whiskers over repeats."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = bars(results)
    configs = list(dict.fromkeys(config for config, *_ in rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.8 * len(configs) + 2), 4.5))
    for j, config in enumerate(configs):
        mine = [row for row in rows if row[0] == config]
        width = 0.8 / len(mine)
        for i, (_, label, median, low, high) in enumerate(mine):
            x = j + (i - (len(mine) - 1) / 2) * width
            ax.bar(x, median, width * 0.9, yerr=[[median - low], [high - median]], capsize=3, color=f"C{i}")
            ax.text(x, high + 0.02, f"{label}\n{median:.2f}", ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="ideal (sum of standalone samples/s)")
    ax.axhline(0.9, color="gray", linestyle=":", linewidth=1, label="goal 0.9")
    ax.set_xticks(range(len(configs)), configs)
    ax.set_xlabel("workers x parameters x emulated step (ms)")
    ax.set_ylabel("ASP samples/s / ideal")
    ax.set_ylim(0, 1.35)
    ax.set_title("ASP at scale: throughput as a fraction of the ideal (median of repeats, min-max)", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", type=Path, help="bench_ps_scale.py result files")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args()
    results = [json.loads(path.read_text()) for path in args.json]
    for config, label, median, low, high in bars(results):
        print(f"{config:<14} {label:<10} {median:.2f} ({low:.2f}-{high:.2f})")
    print(f"wrote {plot(results, args.out)}")


if __name__ == "__main__":
    main()
