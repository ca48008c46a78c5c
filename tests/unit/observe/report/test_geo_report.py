"""`paramshard report`'s GEO section (observe/report/geo_section.py, geo_plots.py) on a GEO run
directory written by hand (tests/unit/observe/geo_run.py), and none on a run without rounds."""
from __future__ import annotations

import json

import pytest

from paramshard.observe.report import html
from paramshard.observe.report.geo_section import geo_lines, html_section
from paramshard.observe.report.report_files import write_report
from paramshard.observe.run_records.run_data import load_run
from tests.unit.observe.geo_run import KS, T0, geo_run

GEO_PNGS = ("geo_k.png", "geo_staleness.png", "geo_bytes_auc.png")


def test_the_table_shows_each_trainers_rounds_and_the_bytes(tmp_path):
    run = geo_run(tmp_path / "run")
    page = html_section(run, html._table, html._e)
    assert page.startswith("<h2>GEO rounds</h2>")
    total = sum(1000 * k + t for t, ks in KS.items() for k in ks)
    assert f"{total / 2**20:,.2f} MiB" in page
    per_sample = total / sum(sum(ks) * 100 for ks in KS.values())
    assert f"{per_sample:,.1f} bytes per sample" in page and "staleness at most 32 local steps" in page
    # trainer 0: 5 rounds, 76 steps, first k 4, last chosen k 64, k from 4 to 32
    assert "<tr><td class=\"n\">0</td><td class=\"n\">5</td><td class=\"n\">76</td><td class=\"n\">4</td>" \
           "<td class=\"n\">64</td><td>4–32</td>" in page


def test_report_prints_each_trainers_k_and_the_bytes(tmp_path):
    lines = geo_lines(geo_run(tmp_path / "run"))
    total = sum(1000 * k + t for t, ks in KS.items() for k in ks)
    assert lines[0].startswith(f"GEO: {total / 2**20:,.2f} MiB on the wire (") and lines[0].endswith(
        ", staleness at most 32 steps")
    assert lines[1] == "  trainer 0: 5 rounds, k 4 -> 64 (range 4-32), wire 40% of its time"   # 0.5 s / (0.5 + 0.76)
    assert lines[2].startswith("  trainer 1: 5 rounds, k 4 -> 64 (range 4-16)")


def test_a_run_without_rounds_has_no_geo_section(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain/metrics.jsonl").write_text(json.dumps({"t": T0, "kind": "event", "event": "start"}) + "\n")
    plain = load_run(tmp_path / "plain")
    assert html_section(plain, html._table, html._e) == "" and geo_lines(plain) == []


@pytest.mark.slow_unit(reason="draws the report's plots (matplotlib)")
def test_the_report_draws_k_the_staleness_and_bytes_against_auc(tmp_path):
    index = write_report(tmp_path / "run", run=geo_run(tmp_path / "run"))
    page = index.read_text()
    for name in GEO_PNGS:
        assert (index.parent / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
        assert f'src="{name}"' in page
    assert "GEO rounds" in page and "GEO: bytes on the wire against validation AUC" in page
