"""examples/demo.py: the report it prints from measured steps, the plot's fallback, and one real run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from examples import demo

REPO = Path(__file__).resolve().parents[2]
B = demo.GLOBAL_BATCH


def steps_every(seconds: float, count: int, epoch: int = 0, start: float = 0.0) -> list[list[float]]:
    """An epoch's start and ``count`` step ends, ``seconds`` apart."""
    return [[epoch, start + i * seconds] for i in range(count + 1)]


def sweep_of(step_s: dict[int, float]) -> dict:
    """A sweep whose every step at rank-1 batch ``b`` takes ``step_s[b]`` (the settling steps take 10 s)."""
    schedule = [
        [B - slow, slow] for _ in range(demo.SWEEP_ROUNDS) for slow in step_s for _ in range(demo.SWEEP_VISIT_STEPS)
    ]
    times = [0.0]
    for step, split in enumerate(schedule):
        settling = step % demo.SWEEP_VISIT_STEPS < demo.SWEEP_SETTLE_STEPS
        times.append(times[-1] + (10.0 if settling else step_s[split[1]]))
    return {"schedule": schedule, "steps": [[0, t] for t in times]}


def results(ddp_step_s: float, hetero_step_s: float, learned: list[int], sweep: dict) -> dict:
    def run(step_s: float, split: list[int]) -> dict:
        steps = [s for epoch in range(demo.EPOCHS) for s in steps_every(step_s, 5, epoch, start=100.0 * epoch)]
        batches = [[t, split[0]] for _, t in steps[1:]]
        return {"split": split, "val_acc": 0.8125, "steps": steps, "rank0_batches": batches}

    return {
        "slow_factor": 4.0,
        "runs": {"ddp": run(ddp_step_s, [B // 2, B // 2]), "hetero": run(hetero_step_s, learned)},
        "sweep": sweep,
    }


def test_sweep_throughput_times_only_settled_steps():
    rates = demo.sweep_throughputs(sweep_of({B // 2: 1.0, 100: 0.25}))
    assert rates == {(B // 2, B // 2): B / 1.0, (B - 100, 100): B / 0.25}


def test_report_puts_both_runs_against_the_best_fixed_split():
    sweep = sweep_of({B // 2: 1.0, 200: 0.5, 100: 0.25})
    lines = demo.report(results(ddp_step_s=2.0, hetero_step_s=0.5, learned=[B - 200, 200], sweep=sweep))
    table = {line[:25].strip(): line[25:].split() for line in lines[2:5]}
    assert table["plain DDP"][:4] == [f"{B / 2.0:.0f}", "0.812", f"{B / 1.0:.0f}", "25%"]
    assert table["HeteroBatchCallback"][:4] == [f"{B / 0.5:.0f}", "0.812", f"{B / 0.5:.0f}", "50%"]
    assert table["best fixed split (sweep)"] == ["-", "-", f"{B / 0.25:.0f}", "100%", f"[{B - 100},", "100]"]
    assert "trained 4.00x as fast as plain DDP" in "\n".join(lines)
    assert len(lines) <= 10


def test_plot_is_skipped_with_a_note_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    sweep = sweep_of({B // 2: 1.0})
    note = demo.plot(results(1.0, 1.0, [B // 2, B // 2], sweep), tmp_path / "throughput.png")
    assert "matplotlib is not installed" in note
    assert not (tmp_path / "throughput.png").exists()


def test_plot_writes_a_png_of_both_runs(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the plots extra)")
    sweep = sweep_of({B // 2: 1.0, 100: 0.25})
    path = tmp_path / "throughput.png"
    note = demo.plot(results(2.0, 0.5, [B - 100, 100], sweep), path)
    assert note == f"plot of both runs' throughput over time: {path}"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_batch_size_plot_writes_a_png_and_skips_without_matplotlib(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the plots extra)")
    measured = results(2.0, 0.5, [B - 100, 100], sweep_of({B // 2: 1.0, 100: 0.25}))
    path = tmp_path / "batch_sizes.png"
    assert demo.plot_batch_sizes(measured, path) == f"plot of each rank's batch size over time: {path}"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert "matplotlib is not installed" in demo.plot_batch_sizes(measured, tmp_path / "other.png")


@pytest.mark.multiprocess
def test_demo_prints_only_its_own_lines(tmp_path):
    env = {key: value for key, value in os.environ.items() if key not in ("MASTER_PORT", "PYTHONPATH")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "demo.py"), "--out", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert len(lines) <= 20, proc.stdout
    for banner in ("GPU available", "Tip:", "Initializing distributed", "distributed_backend", "Warning"):
        assert banner not in proc.stdout
    measured = json.loads((tmp_path / "demo.json").read_text())
    accuracies = [measured["runs"][method]["val_acc"] for method in ("ddp", "hetero")]
    assert all(0.5 < acc < 1.0 for acc in accuracies), accuracies
    assert abs(accuracies[0] - accuracies[1]) < 0.05, accuracies
    for method in ("ddp", "hetero"):
        sizes = {size for _, size in measured["runs"][method]["rank0_batches"]}
        assert sizes and all(0 < size < demo.GLOBAL_BATCH for size in sizes), sizes
    assert any(line.startswith("best fixed split (sweep)") for line in lines)
