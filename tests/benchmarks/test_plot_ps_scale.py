"""plot_ps_scale: bars read from bench_ps_scale JSON, and the PNG written from them."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "plot_ps_scale.py"
spec = importlib.util.spec_from_file_location("plot_ps_scale", SCRIPT)
plot_ps_scale = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot_ps_scale)


def _result(config: str, **variants: list[float]) -> dict:
    return {
        "summary": {
            config: {
                label: {"asp_over_ideal_median": sorted(each)[len(each) // 2], "asp_over_ideal_each": each}
                for label, each in variants.items()
            }
        }
    }


def test_bars_keep_file_and_variant_order_with_the_spread_of_repeats():
    results = [_result("2x0.25Mx3", textbook=[0.69, 0.68, 0.57], overlap=[0.76, 0.63, 0.63]), _result("4x4.3Mx65")]
    results[1]["summary"]["4x4.3Mx65"] = _result("4x4.3Mx65", overlap=[0.93, 0.91, 0.92])["summary"]["4x4.3Mx65"]
    assert plot_ps_scale.bars(results) == [
        ("2x0.25Mx3", "textbook", 0.68, 0.57, 0.69),
        ("2x0.25Mx3", "overlap", 0.63, 0.63, 0.76),
        ("4x4.3Mx65", "overlap", 0.92, 0.91, 0.93),
    ]


def test_main_writes_a_png_and_prints_the_bars(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the plots extra)")
    path = tmp_path / "ps.json"
    path.write_text(json.dumps(_result("16x0.25Mx65", textbook=[0.85, 0.86, 0.84], overlap=[0.91, 0.91, 0.88])))
    out = tmp_path / "ps.png"
    monkeypatch.setattr(sys, "argv", ["plot_ps_scale.py", str(path), "--out", str(out)])
    plot_ps_scale.main()
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "16x0.25Mx65    overlap    0.91 (0.88-0.91)" in capsys.readouterr().out
