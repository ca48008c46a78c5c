"""`paramshard report`: plots and index.html of a run directory built here by hand,
following paramshard.observe.run_records.records (finished async run, sync run, run in progress)."""
from __future__ import annotations

import argparse
import json
import math

import pytest

from paramshard.errors import ConfigError
from paramshard.observe.run_records.records import write_json
from paramshard.observe.report.report_files import write_report

PNGS = ["loss.png", "throughput.png", "server_load.png", "phases.png", "staleness.png", "requests.png"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
LOGS = ["server-0.log", "server-1.log", "trainer-0.log", "trainer-1.log"]
T0 = 1_790_000_000.0


def make_run(root, *, asynchronous=True, finished=True, steps=50):
    """A run directory of 2 servers and 2 trainers, as the launcher writes it."""
    root.mkdir(parents=True, exist_ok=True)
    records = [{"t": T0, "kind": "event", "event": "start", "text": "job ab12cd started"}]
    for i in range(steps):
        for trainer in (0, 1):
            step = (i + 1) * 4
            records.append({
                "t": T0 + 1 + i + 0.1 * trainer, "kind": "trainer", "trainer": trainer, "step": step,
                "samples": step * 256, "samples_per_s": 1000.0 + 50 * math.sin(i / 5) + 100 * trainer,
                "loss": 0.7 * math.exp(-i / 20) + 0.01 * trainer, "epoch": i // 25,
                "metrics": {"auc": 0.5 + 0.4 * (1 - math.exp(-i / 10)), "lr": 0.01},
                "phases": {"pull": 0.002, "compute": 0.005 + 0.001 * trainer, "push": 0.003},
                "staleness_max": (2 if asynchronous else None)})
        if i % 2 == 0:
            for server in (0, 1):
                requests = (i + 1) * 40 * (1 + server)
                records.append({
                    "t": T0 + 1.5 + i, "kind": "server", "server": server, "rows": 1000 * (server + 1),
                    "elements": 50_000 - 10_000 * server, "bytes_in": requests * 4096, "bytes_out": requests * 2048,
                    "requests": requests, "requests_per_s": 40.0 * (1 + server), "queue_s": 1e-4, "update_s": 2e-4,
                    "staleness": ({"0": 10 * i, "1": 4 * i, "2": i} if asynchronous else {})})
    if finished:
        records.append({"t": T0 + steps + 2, "kind": "event", "event": "end", "text": "job ab12cd finished"})
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    write_json(root / "plan.json", {"servers": [
        {"server": s, "address": f"127.0.0.1:{45100 + s}", "dense_blocks": 3 - s, "dense_elements": 50_000 - 10_000 * s,
         "tables": {"emb": {"rows": 1000 * (s + 1), "dim": 8}}} for s in (0, 1)], "dense_load_max_over_mean": 1.111})
    write_json(root / "config.json", {"job_id": "ab12cd", "servers": 2, "trainers": 2})
    (root / "logs").mkdir(exist_ok=True)
    for name in LOGS:
        (root / "logs" / name).write_text(f"{name} output\n")
    if finished:
        write_json(root / "summary.json", {
            "job_id": "ab12cd", "started": T0, "ended": T0 + steps + 2, "duration_s": steps + 2.0, "exit_code": 3,
            "processes": [{"name": f"{role} {i}", "host": "localhost", "exit_code": 3 if (role, i) == ("trainer", 1)
                           else 0} for role in ("server", "trainer") for i in (0, 1)],
            "totals": {"steps": {"0": steps * 4, "1": steps * 4}, "samples": 2 * steps * 4 * 256, "sparse_rows": 3000,
                       "dense_elements": 90_000, "requests": 12345, "bytes_in": 2**30, "bytes_out": 2**29},
            "staleness": ({"max": 2, "histogram": {"0": 490, "1": 196, "2": 49}} if asynchronous else None)})
    return root


def assert_png(path):
    import matplotlib.image
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) > 1024, path
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] >= 200 and image.shape[1] >= 300, (path, image.shape)


@pytest.fixture(scope="module")
def async_report(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("async") / "run")
    return run, write_report(run)


def test_every_plot_is_a_png_and_the_page_shows_them_the_summary_and_the_logs(async_report):
    run, index = async_report
    assert index == run / "report" / "index.html"
    for name in PNGS:
        assert_png(run / "report" / name)
    page = index.read_text()
    for name in PNGS:
        assert f'<img src="{name}"' in page
    for name in LOGS:
        assert f'href="../logs/{name}"' in page
    assert "ab12cd" in page and "<th>exit code</th><td>3</td>" in page
    assert "trainer 1" in page and "127.0.0.1:45101" in page and "emb (2,000 × 8)" in page
    assert "Not drawn" not in page and "still running" not in page
    assert "<script" not in page.lower() and "http://" not in page and "https://" not in page


@pytest.mark.slow_unit(reason="draws the report's plots (matplotlib)")
def test_a_sync_run_has_no_staleness_plot_and_the_page_says_why(tmp_path):
    run = make_run(tmp_path / "run", asynchronous=False)
    (run / "report").mkdir()
    (run / "report" / "staleness.png").write_bytes(b"an older report's")     # must not outlive its data
    summary = json.loads((run / "summary.json").read_text())
    totals = summary["totals"]
    totals["rows"], totals["elements"] = totals.pop("sparse_rows"), totals.pop("dense_elements")  # servers' names
    write_json(run / "summary.json", summary)
    page = write_report(run).read_text()
    assert "<th>sparse rows</th><td>3,000</td>" in page and "<th>dense elements</th><td>90,000</td>" in page
    assert "<th>max staleness</th><td>— (none: sync)</td>" in page
    assert not (run / "report" / "staleness.png").exists()
    assert "staleness.png" not in page
    assert "Not drawn: no async push staleness was recorded (sync runs have none)." in page
    for name in PNGS:
        if name != "staleness.png":
            assert_png(run / "report" / name)


@pytest.mark.slow_unit(reason="draws the report's plots (matplotlib)")
def test_a_run_in_progress_with_a_torn_last_line(tmp_path):
    run = make_run(tmp_path / "run", finished=False, steps=10)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"t": 1790000100.0, "kind": "trainer", "trainer": 0, "st')        # the writer mid-line
    page = write_report(run).read_text()
    assert "still running or interrupted" in page
    assert "ab12cd" in page                           # from config.json: there is no summary yet
    assert_png(run / "report" / "loss.png")


@pytest.mark.slow_unit(reason="draws the report's plots (matplotlib)")
def test_escapes_text_and_tolerates_odd_records(tmp_path):
    run = make_run(tmp_path / "run", steps=5)
    with open(run / "metrics.jsonl", "a") as f:
        f.write("3\n" + json.dumps({"t": T0 + 9, "kind": "event", "event": "failure",
                                    "text": "<b>trainer 1</b> & died"}) + "\n")
        f.write(json.dumps({"t": T0 + 9, "kind": "trainer", "trainer": 0, "step": "x", "loss": "nan"}) + "\n")
        f.write(json.dumps({"kind": "trainer", "trainer": 0}) + "\n")                       # no time
    (run / "plan.json").write_text("{half")
    page = write_report(run).read_text()
    assert "&lt;b&gt;trainer 1&lt;/b&gt; &amp; died" in page and "<b>trainer" not in page
    assert "plan.json could not be read" in page


def test_a_directory_that_is_not_a_run_directory(tmp_path):
    with pytest.raises(ConfigError, match=r"is not a run directory: it has no metrics.jsonl"):
        write_report(tmp_path)
    with pytest.raises(ConfigError, match=r"nope: no such directory"):
        write_report(tmp_path / "nope")


def test_help_shows_defaults_and_an_example():
    from paramshard.cli.main import build_parser
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = action.choices["report"]
    text = parser.format_help()
    assert "\n  paramshard report runs/" in text and "(default: RUN_DIR/report)" in text


@pytest.mark.slow_unit(reason="draws the report's plots (matplotlib)")
def test_a_restart_is_in_the_events_table_and_the_servers_counters_are_job_totals(tmp_path):
    from paramshard.observe.run_records.run_data import load_run
    run = make_run(tmp_path / "run", steps=6)
    last = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
            if '"server": 1' in line][-1]
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"t": T0 + 7, "kind": "event", "event": "restart", "rank": "server 1",
                            "text": "killed; restarting it in place"}) + "\n")
        # a run directory each rank wrote itself: the new process's counters start from 0
        f.write(json.dumps(dict(last, t=T0 + 8, requests=7, bytes_in=70, bytes_out=70)) + "\n")
    servers = load_run(run).servers
    assert servers[1][-1]["requests"] == last["requests"] + 7 and servers[1][-1]["restarts"] == 1
    page = write_report(run).read_text()
    assert "<td>restart</td><td>server 1</td><td>killed; restarting it in place</td>" in page
