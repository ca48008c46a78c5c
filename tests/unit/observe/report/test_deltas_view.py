"""`paramshard report`'s "Deltas and serving replicas" (observe/report/deltas_view.py) from a run
directory written here as the launcher writes it (server records carrying the publisher's
``deltas`` counters, config.json naming the delta directory) and a delta directory holding replicas'
status files (online/replica_status.py): the figures are the oracle's arithmetic on the records."""
import argparse
import json

from paramshard.cli.jobs import report as report_cli
from paramshard.observe.report.deltas_view import delta_dir_of, from_records, run_lines
from paramshard.observe.report.html import render_index
from paramshard.observe.run_records.records import write_json
from paramshard.observe.run_records.run_data import load_run
from paramshard.online.replica_status import status_path, write_status
from tests.unit.serving.delta_dir import change, publish

T0 = 1_790_000_000.0


def counters(deltas, snapshots, delta_bytes, rows, max_bytes, max_rows, last_seq, snapshot=(0, 0)):
    return {"deltas": deltas, "snapshots": snapshots, "bytes": delta_bytes + 5000 * snapshots,
            "delta_bytes": delta_bytes, "snapshot_bytes": 5000 * snapshots, "rows": rows, "tombstones": 0,
            "max_delta_bytes": max_bytes, "max_delta_rows": max_rows, "last_snapshot_bytes": snapshot[0],
            "last_snapshot_rows": snapshot[1], "last_seq": last_seq, "since_last_s": 0.5, "last_publish_s": 0.01}


# Server 0: 2 deltas by t=2 (mean 100 B / 10 rows), 4 more by t=62 (mean 300 B / 30 rows), then a restart
# in place: its new process counted 1 delta of 200 B / 20 rows by t=122. Server 1 published nothing.
SERVER0 = [(2, counters(2, 1, 200, 20, 150, 15, 2, (5000, 40))),
           (62, counters(6, 1, 1400, 140, 700, 70, 6, (5000, 40))),
           (122, counters(1, 1, 200, 20, 200, 20, 8, (6000, 50)))]


def run_dir(root, delta_dir=None):
    root.mkdir()
    lines = [{"t": T0, "kind": "event", "event": "start", "text": "2 servers, 1 trainer"}]
    lines += [{"t": T0 + t, "kind": "server", "server": 0, "requests": 1, "deltas": d} for t, d in SERVER0]
    lines += [{"t": T0 + 2, "kind": "server", "server": 1, "requests": 1}]
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    write_json(root / "config.json", {"job_id": "ab12cd", "launch": {"delta_dir": delta_dir}, "ranks": {}})
    return root


def replica(root, name_port, applied, updated, freshness=1.5, interval=5.0):
    write_status(status_path(root, "h", name_port), {
        "replica": f"h-{name_port}", "url": f"http://127.0.0.1:{name_port}", "interval_s": interval,
        "started": T0, "updated": updated, "version": {"servers": applied, "step": 7, "number": 3}, "step": 7,
        "newest_created": updated - freshness, "freshness_s": freshness, "files_applied": 9, "rows_applied": 90,
        "ok": True, "errors": {}, "last_error": None})


def test_the_publishing_figures_from_records_across_a_restart(tmp_path):
    p = from_records(0, [{"t": T0 + t, "deltas": d} for t, d in SERVER0])
    assert p.deltas == 2 + 4 + 1 and p.snapshots == 2
    assert p.per_minute == (4 + 1) / 120 * 60                 # deltas published between the first and last record
    assert (p.median_bytes, p.median_rows) == (200, 20)      # the median of 100, 300, 200 (and 10, 30, 20)
    assert (p.max_bytes, p.max_rows) == (700, 70)
    assert (p.snapshot_bytes, p.snapshot_rows, p.last_seq, p.since_last_s) == (6000, 50, 8, 0.5)
    assert from_records(1, [{"t": T0, "requests": 1}]) is None


def test_the_run_report_shows_the_publishing_and_each_replica_fresh_or_gone(tmp_path, capsys, monkeypatch):
    deltas = tmp_path / "deltas"
    publish(deltas, "snapshot", 0, 8, 3, change([1], 0.5))
    publish(deltas, "snapshot", 1, 4, 3, change([2], 0.5))
    now = T0 + 200
    replica(deltas, 8500, {"0": 8, "1": 2}, updated=now - 1)
    replica(deltas, 8501, {"0": 5}, updated=now - 16)          # more than 3 x 5 s without a rewrite: gone
    run = load_run(run_dir(tmp_path / "run", str(deltas)))
    assert delta_dir_of(run) == deltas
    lines = run_lines(run, now=now)
    assert lines[0] == f"deltas ({deltas}):"
    assert lines[1] == ("  server 0: 7 deltas (2.5/min), size median 200 B / 20 rows, max 700 B / 70 rows; "
                        "2 snapshots, the last 5.9 KiB / 50 rows; last seq 8, 0.5 s before its last record")
    assert lines[2] == "  serving replicas (2):"
    assert lines[3] == ("    replica h-8500 (http://127.0.0.1:8500): ok; freshness 1.5 s, step 7, lag: server 0 0 "
                        "behind, server 1 2 behind; 9 files applied; status 1.0 s old")
    assert lines[4].startswith("    replica h-8501 (http://127.0.0.1:8501): GONE or hung: its status was not "
                               "rewritten for 16.0 s (more than 3 x its 5 s)")
    assert lines[4].endswith("server 0 3 behind, server 1 not served yet") and len(lines) == 5

    monkeypatch.setattr("paramshard.observe.report.deltas_view.time.time", lambda: now)     # the page's and CLI's now
    page = render_index(run, [], tmp_path)
    section = page[page.index("<h2>Deltas and serving replicas</h2>"):]
    assert '<td class="n">7</td><td class="n">2.5</td><td class="n">200 B</td><td class="n">700 B</td>' in section
    assert "<td>h-8501</td><td>gone or hung (stale)</td>" in section
    assert "<td>h-8500</td><td>ok</td>" in section and "0: 0, 1: 2" in section

    # The command prints the section after the result, before the page's path (no drawing here).
    monkeypatch.setattr("paramshard.observe.report.report_files.write_report",
                        lambda run_dir, out, run=None: run_dir / "report/index.html")
    assert report_cli.run(argparse.Namespace(run_dir=tmp_path / "run", out=None)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-6:-1] == lines and out[-1].endswith("index.html")

    # Given the delta directory itself: the figures from its files, then the replicas.
    assert report_cli.run(argparse.Namespace(run_dir=deltas, out=None)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"delta directory {deltas}:"
    assert out[1].startswith("  server 0: 0 deltas; 1 snapshots, the last") and "/ 1 rows; last seq 8" in out[1]
    assert out[3] == "serving replicas (2):" and "GONE or hung" in out[5]


def test_a_job_without_deltas_has_no_section_and_a_missing_directory_is_said(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "metrics.jsonl").write_text(json.dumps({"t": T0, "kind": "server", "server": 0, "requests": 1}) + "\n")
    run = load_run(plain)
    assert run_lines(run) == [] and "Deltas and serving replicas" not in render_index(run, [], tmp_path)
    run = load_run(run_dir(tmp_path / "moved", str(tmp_path / "gone")))
    assert run_lines(run, now=T0)[-1] == f"  the delta directory {tmp_path / 'gone'} is not there (moved, or on " \
                                         f"another host): no replicas shown"
