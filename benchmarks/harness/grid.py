"""The grid of conditions a study did not tune for: from its base point, one axis of ``AXES`` varied at a time; each
figure is reported as the median and the worst cell.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import stats
from benchmarks.harness.record import begin, conditions, write_json

AXES = ("emulation", "cost", "epoch", "workers", "quota")


@dataclass(frozen=True)
class Cell:
    """One point of the grid: ``axis`` varied to ``label`` by setting the study's arguments ``overrides``."""

    axis: str
    label: str
    overrides: dict[str, Any] = field(default_factory=dict)


def scaled(values: str, factor: float) -> str:
    """A comma-separated list of numbers (a flag's value), each times ``factor``.

    Example::

        >>> scaled("4,8", 2)
        '8,16'
    """
    return ",".join(f"{float(v) * factor:g}" for v in values.split(","))


def workers_hl_axes(args: argparse.Namespace, cost: str) -> dict[str, list[Cell] | str]:
    """The axes of a study over ``--workers`` x ``--hl`` with ``--throttle`` sleep or cfs, ``--samples`` per epoch and
    the per-sample cost in ``args.<cost>``: one condition varied at a time from the command line's cells."""
    other = "cfs" if args.throttle == "sleep" else "sleep"
    return {
        "emulation": [Cell("emulation", other, {"throttle": other})],
        "cost": [Cell("cost", f"x{k:g}", {cost: getattr(args, cost) * k}) for k in (0.5, 2)],
        "epoch": [Cell("epoch", f"x{k:g}", {"samples": round(args.samples * k)}) for k in (0.25, 4)],
        "workers": [Cell("workers", "x2", {"workers": scaled(args.workers, 2)})],
        "quota": [Cell("quota", f"HL x{k:g}", {"throttle": "cfs", "hl": scaled(args.hl, k)}) for k in (0.5, 2)],
    }


def cells(axes: dict[str, list[Cell] | str], only: list[str]) -> tuple[list[Cell], dict[str, str]]:
    """The base cell and the cells of the chosen axes (``only``: some axes, and the base cell only if it names
    ``base``, e.g. to finish a grid cut short), and the skipped axes with their reasons."""
    chosen = [Cell("base", "base point")] if not only or "base" in only else []
    skipped = {}
    for axis in [a for a in only if a != "base"] or AXES:
        if axis not in AXES:
            raise ValueError(f"unknown grid axis {axis!r}; known: {', '.join(AXES)}")
        value = axes.get(axis, "the study has no such condition")
        if isinstance(value, str):
            skipped[axis] = value
        else:
            chosen += value
    return chosen, skipped


def run_grid(
    name: str,
    args: argparse.Namespace,
    out_dest: str,
    axes: dict[str, list[Cell] | str],
    run: Callable[[argparse.Namespace], None],
    figures: Callable[[dict[str, Any]], dict[str, float]],
    only: list[str],
) -> Path:
    """Runs ``run`` once per cell (its JSON beside the summary), collects ``figures`` from each cell's JSON, prints
    the grid and writes ``<out>_grid.json``: each figure's median and worst cell with the cell's conditions."""
    chosen, skipped = cells(axes, only)
    for axis, reason in skipped.items():
        print(f"grid {name}: axis {axis} skipped: {reason}", flush=True)
    base_out = Path(getattr(args, out_dest))
    folder = base_out.with_name(base_out.stem + "_grid")
    rows: list[dict[str, Any]] = []
    summary_path = base_out.with_name(base_out.stem + "_grid.json")

    def summarise() -> dict[str, Any]:
        by_figure: dict[str, Any] = {}
        for figure in dict.fromkeys(f for row in rows for f in row.get("figures", {})):
            values = [(row["figures"][figure], row) for row in rows if figure in row.get("figures", {})]
            worst_value, worst = min(values, key=lambda item: item[0])
            by_figure[figure] = {
                "cells": len(values),
                "median": stats.median(v for v, _ in values),
                "worst": worst_value,
                "worst_cell": f"{worst['axis']}: {worst['label']}",
                "base": next((v for v, row in values if row["axis"] == "base"), None),
            }
        return by_figure

    for cell in chosen:
        cell_args = copy.copy(args)
        for key, value in cell.overrides.items():
            setattr(cell_args, key, value)
        slug = "base" if cell.axis == "base" else f"{cell.axis}_{cell.label}".replace(" ", "_").replace("/", "-")
        setattr(cell_args, out_dest, folder / f"{slug}.json")
        print(f"grid {name}: cell {cell.axis}: {cell.label} {cell.overrides or ''}", flush=True)
        row: dict[str, Any] = {"axis": cell.axis, "label": cell.label, "overrides": cell.overrides}
        started, load_before = time.time(), conditions()["load_average"]
        try:
            begin(cell_args)
            run(cell_args)
            row["figures"] = figures(json.loads(Path(getattr(cell_args, out_dest)).read_text()))
        except Exception as error:  # a failed cell is reported, and the grid goes on
            row["error"] = f"{type(error).__name__}: {str(error)[-1500:]}"
            print(f"grid {name}: cell failed: {row['error']}", flush=True)
        row |= {"json": str(getattr(cell_args, out_dest)), "wall_s": round(time.time() - started, 1)}
        row["load_average_before_after"] = [load_before, conditions()["load_average"]]
        rows.append(row)
        write_json(summary_path, {"scenario": name, "skipped_axes": skipped, "cells": rows, "figures": summarise()})
    print_grid(name, rows, summarise())
    return summary_path


def print_grid(name: str, rows: list[dict[str, Any]], by_figure: dict[str, Any]) -> None:
    print(f"\ngrid of {name}: {len(rows)} cells")
    figures = list(by_figure)
    print(f"{'cell':<30}" + "".join(f"{f[:22]:>24}" for f in figures))
    for row in rows:
        values = row.get("figures", {})
        text = "".join(f"{values[f]:>24.3f}" if f in values else f"{'-':>24}" for f in figures)
        print(f"{row['axis'] + ': ' + row['label']:<30}{text}{'  failed' if 'error' in row else ''}")
    for key, f in by_figure.items():
        print(f"{key}: median {f['median']:.3f} of {f['cells']} cells, worst {f['worst']:.3f} ({f['worst_cell']})")
