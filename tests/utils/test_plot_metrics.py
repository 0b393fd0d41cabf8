"""The per-step metrics plot: reading metrics.jsonl, choosing the panels, writing the PNG (when matplotlib is
installed; it is optional) and the CLI."""

import json

import pytest

from verl.utils import plot_metrics
from verl.utils.plot_metrics import PlotUnavailableError, read_metrics_jsonl, select_keys, write_metrics_png


def _write(path, records, tail=""):
    path.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in records) + tail)


def test_read_merges_lines_of_a_step_and_skips_a_truncated_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    records = [(0, {"val-core/x/reward/mean@1": 0.1}), (1, {"critic/score/mean": 0.2}), (1, {"critic/score/mean": 0.3})]
    _write(path, records, tail='{"step": 2, "da')
    assert read_metrics_jsonl(path) == [(0, {"val-core/x/reward/mean@1": 0.1}), (1, {"critic/score/mean": 0.3})]


def test_read_rejects_a_line_that_is_not_a_record(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "data": {}}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a metrics record"):
        read_metrics_jsonl(path)


def test_select_keys_keeps_order_expands_prefixes_and_drops_absent_or_text():
    records = [
        (1, {"critic/score/mean": 0.5, "actor/pg_loss": "nan", "timing_s/step": 2.0}),
        (2, {"val-core/b/reward/mean@1": 1.0, "val-core/a/reward/mean@1": 0.0, "actor/entropy": 1.2}),
    ]
    keys = ["critic/score/mean", "val-core/*", "actor/entropy", "actor/pg_loss", "actor/grad_norm", "timing_s/step"]
    assert select_keys(records, keys) == [
        "critic/score/mean",
        "val-core/a/reward/mean@1",
        "val-core/b/reward/mean@1",
        "actor/entropy",
        "timing_s/step",
    ]


def test_png_and_cli(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "metrics.jsonl"
    _write(path, [(s, {"critic/score/mean": s / 10, "actor/entropy": 1 - s / 20}) for s in range(1, 11)])
    assert plot_metrics.main([str(path)]) == 0
    png = tmp_path / "metrics.png"
    assert capsys.readouterr().out.strip() == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_no_matplotlib_is_a_clear_error(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PlotUnavailableError, match="pip install matplotlib"):
        write_metrics_png([(1, {"critic/score/mean": 0.5})], tmp_path / "m.png")


def test_cli_on_a_missing_file_names_it(tmp_path, capsys):
    with pytest.raises(SystemExit):
        plot_metrics.main([str(tmp_path / "nope.jsonl")])
    assert "nope.jsonl does not exist" in capsys.readouterr().err
