"""The benchmark matrix's pure parts: HL -> slowdown factors, summarising rank reports, comparing and the table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from benchmarks.harness.cli import main
from benchmarks.harness.launch import RESULTS, ROOT
from benchmarks.scenarios import matrix


@pytest.mark.parametrize("level", ["HL1", "HL2", "HL4", "HL8"])
@pytest.mark.parametrize("ranks", [2, 4])
def test_factors_keep_the_level_and_put_the_fastest_rank_first(level, ranks):
    factors = matrix.hl_factors(level, ranks)
    assert len(factors) == ranks
    assert factors[0] == 1.0
    assert factors == sorted(factors)
    assert max(factors) == pytest.approx(int(level[2:]))


def test_four_ranks_follow_omnilearns_bsp_table():
    # HL4 is 9, 9, 6, 24 cores; HL2 is 12, 12, 8, 16
    assert matrix.hl_factors("HL4", 4) == [1.0, 2.6667, 2.6667, 4.0]
    assert matrix.hl_factors("HL2", 4) == [1.0, 1.3333, 1.3333, 2.0]
    assert matrix.hl_factors("HL1", 2) == [1.0, 1.0]


def test_bad_level_or_rank_count_is_named():
    with pytest.raises(ValueError, match="HL3"):
        matrix.hl_factors("HL3", 4)
    with pytest.raises(ValueError, match="ranks must be 2 or 4, got 3"):
        matrix.hl_factors("HL2", 3)


def test_emulated_bound_sums_the_ranks_speeds():
    assert matrix.emulated_bound([1.0, 8.0], cost_s=0.0005) == pytest.approx(2000 + 250)


def fake_rank(rank, starts, ends, samples, accs, hetero=False):
    epochs = [
        {"epoch": i, "mode": "bsp", "start": s, "end": e, "samples": n, "steps": 2, "cpu_s": 0.1, "val_acc": a}
        for i, (s, e, n, a) in enumerate(zip(starts, ends, samples, accs, strict=True))
    ]
    return {
        "rank": rank,
        "factor": 1.0,
        "epochs": epochs,
        "steps": [[starts[0] + 0.5, 32], [starts[1] + 0.5, 48]],
        "slept_s": 0.9,
        "first_stretches_s": [0.0],
        "global_step": 6,
        "hetero_history": [{"step": 2}] if hetero else None,
        "final_split": [48, 16] if hetero else None,
        "server_summary": None,
        "switches": None,
    }


def fake_reports(hetero=False, slow=1.0):
    # three epochs; epoch 0 is the warm-up; rank 1 ends each epoch last
    starts = [100.0, 110.0, 120.0]
    return [
        fake_rank(1, starts, [s + 4.0 * slow for s in starts], [64, 64, 64], [0.5, 0.7, 0.8], hetero),
        fake_rank(0, starts, [s + 2.0 for s in starts], [64, 64, 64], [0.5, 0.7, 0.8], hetero),
    ]


def test_summarise_times_the_epochs_after_the_warm_up():
    row = matrix.summarise(fake_reports(hetero=True))
    assert row["train_s"] == pytest.approx(8.0)
    assert row["warmup_train_s"] == pytest.approx(4.0)
    assert row["samples"] == 256
    assert row["samples_per_s"] == pytest.approx(32.0)
    assert row["median_epoch_samples_per_s"] == pytest.approx(32.0)
    assert row["accuracy_curve"] == [[0.0, 0.5], [4.0, 0.7], [8.0, 0.8]]
    assert row["final_acc"] == 0.8
    assert [e["warmup"] for e in row["epochs"]] == [True, False, False]
    assert row["real_share_max"] == pytest.approx(0.3 / 1.2)
    assert row["cores_busy"] == pytest.approx(0.4 / 8.0)
    assert row["batch_sizes"][0] == [[0.5, 32], [10.5, 48]]
    assert row["timed_from_s"] == pytest.approx(10.0)
    assert row["final_split"] == [48, 16]
    assert matrix.summarise(fake_reports())["batch_sizes"] is None


def test_compare_against_plain_ddp_and_the_table_and_json():
    rows = []
    for method, slow in (("ddp", 2.0), ("hetero", 1.0)):
        row = {"method": method, "level": "HL8", "ranks": 2, "factors": [1.0, 8.0], "status": "ok"}
        row["bound_samples_per_s"] = 2250.0
        rows.append(row | matrix.summarise(fake_reports(slow=slow)))
    rows.append({"method": "asp", "level": "HL8", "ranks": 2, "status": "failed", "error": "Traceback\nBoom"})
    matrix.compare(rows)
    ddp, hetero, failed = rows
    assert ddp["speedup_vs_ddp"] == pytest.approx(1.0)
    assert hetero["speedup_vs_ddp"] == pytest.approx(2.0)
    assert hetero["time_saved_vs_ddp_pct"] == pytest.approx(50.0)
    assert hetero["acc_minus_ddp_points"] == pytest.approx(0.0)
    assert hetero["time_to_target_s"] == pytest.approx(8.0)  # 0.8 - 0.005 first reached after the last epoch
    assert "speedup_vs_ddp" not in failed

    table = matrix.format_table(rows)
    lines = table.splitlines()
    assert len(lines) == 2 + len(rows)
    assert "HeteroBatch BSP" in lines[3] and "2.00x" in lines[3]
    assert "failed" in lines[4] and "Boom" in lines[4]

    report = json.loads(json.dumps({"conditions": {}, "rows": rows}))
    assert {"train_s", "samples_per_s", "final_acc", "accuracy_curve", "speedup_vs_ddp"} <= set(report["rows"][1])


def test_docstring_examples():
    import doctest

    assert doctest.testmod(matrix).failed == 0


def test_without_matplotlib_the_plots_are_skipped_with_a_note(tmp_path, monkeypatch, capsys):
    row = {"method": "ddp", "level": "HL8", "ranks": 2, "factors": [1.0, 8.0], "status": "ok"}
    row |= {"bound_samples_per_s": 2250.0} | matrix.summarise(fake_reports())
    out = tmp_path / "matrix.json"
    out.write_text(json.dumps({"conditions": {}, "rows": [row]}))
    monkeypatch.setattr(matrix.importlib.util, "find_spec", lambda name: None)
    main(["run", "matrix", "--replot", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "matplotlib is not installed" in printed and "plots skipped" in printed
    assert json.loads(out.read_text())["rows"][0]["method"] == "ddp"
    assert not list(tmp_path.glob("*.png"))


def test_replot_of_the_committed_results_writes_the_three_plots(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the plots extra)")
    out = tmp_path / "matrix.json"
    shutil.copy(RESULTS / "matrix.json", out)
    main(["run", "matrix", "--replot", "--out", str(out)])
    printed = capsys.readouterr().out
    pngs = sorted(path.name for path in tmp_path.glob("*.png"))
    assert pngs == ["matrix_accuracy.png", "matrix_batch_sizes.png", "matrix_throughput.png"]
    assert all(f"wrote {tmp_path / name}" in printed for name in pngs)
    assert all((tmp_path / name).read_bytes()[:4] == b"\x89PNG" for name in pngs)


@pytest.mark.parametrize("quick", [False, True])
def test_runs_write_where_git_ignores_them(quick):
    repo = ROOT
    out = matrix.default_out(quick).relative_to(repo)
    ignored = [line.strip("/") for line in (repo / ".gitignore").read_text().splitlines() if line.endswith("/")]
    assert any(str(out).startswith(folder + "/") for folder in ignored), out
    assert out != Path("benchmarks/results/matrix.json")
