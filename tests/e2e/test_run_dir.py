"""`paramshard launch` writes a run directory anyone can read: logs, configuration,
plan, metrics (checked against what the servers and trainers did), summary, and
with --report the plots; progress lines when stdout is not a terminal; /metrics."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.in_process import cli_in_process

import random
import socket
from contextlib import ExitStack

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests/e2e/scripts/observed.py"
STEPS = 60


def launch(*args, timeout=180, env=None):
    return subprocess.run([sys.executable, "-m", "paramshard", "launch", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def consecutive_free_ports(count: int) -> int:
    """A base port with ``count`` free ports from it (server i at base+i, trainer j after them)."""
    for _ in range(200):
        base = random.randrange(20000, 60000)
        try:
            with ExitStack() as stack:
                for i in range(count):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
    raise RuntimeError("no run of free ports found")


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def samples(text: str, name: str) -> float:
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name)


def test_a_2_plus_2_job_writes_its_run_directory_report_and_metrics(tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    port = consecutive_free_ports(4)
    r = launch("--servers", "2", "--trainers", "2", "--mode", "async", "--run-dir", str(run), "--report",
               "--metrics-port", str(port), str(SCRIPT), "--out", str(out), "--steps", str(STEPS),
               "--metrics-port", str(port))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    # every process's log, and the records taken out of the output
    logs = sorted(p.name for p in (run / "logs").iterdir())
    assert logs == ["server-0.log", "server-1.log", "trainer-0.log", "trainer-1.log"]
    assert "server 0" in (run / "logs/server-0.log").read_text()
    assert "paramshard-metrics" not in r.stdout + "".join((run / "logs" / n).read_text() for n in logs)

    # configuration: the contract of every rank, no secret
    config = json.loads((run / "config.json").read_text())
    assert set(config["ranks"]) == {"server 0", "server 1", "trainer 0", "trainer 1"}
    assert config["ranks"]["trainer 1"]["environ"]["PARAMSHARD_TRAINER_ID"] == "1"

    # metrics: step counts, and rows held equal the table sizes the servers report
    recs = records(run)
    trainers = [x for x in recs if x["kind"] == "trainer"]
    for t in (0, 1):
        mine = [x for x in trainers if x["trainer"] == t]
        assert mine and mine[-1]["step"] == STEPS and mine[-1]["samples"] == 32 * STEPS
        assert all(x["loss"] is None or 0 < x["loss"] < 5 for x in mine)
        assert mine[-1]["metrics"]["my_metric"] == (STEPS - 1) / STEPS
        assert set(mine[-1]["phases"]) == {"pull", "compute", "push"} and mine[-1]["total_steps"] == STEPS
        steps = [x["step"] for x in mine]
        assert steps == sorted(steps)
        # every value the script logged, with the step it was logged at (not one a record)
        logged = [(c["step"], c["values"]["my_metric"]) for x in mine for c in x["logged"]
                  if "my_metric" in c["values"]]
        assert logged == [(step + 1, step / STEPS) for step in range(STEPS)]

    # TensorBoard: the same records, read back by TensorBoard's own reader
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    assert sorted(p.name for p in (run / "tensorboard").iterdir()) == \
        ["server-0", "server-1", "trainer-0", "trainer-1"]
    for t in (0, 1):
        events = EventAccumulator(str(run / "tensorboard" / f"trainer-{t}"), size_guidance={"scalars": 0})
        events.Reload()
        assert [(e.step, e.value) for e in events.Scalars("my_metric")] == \
            [(step + 1, pytest.approx(step / STEPS)) for step in range(STEPS)]
        assert events.Scalars("trainer/samples_per_s")[-1].step == STEPS
    stats = json.loads((out / "server_stats.json").read_text())
    servers = {x["server"]: x for x in recs if x["kind"] == "server"}      # the last of each
    for s in stats:
        assert servers[s["server"]]["rows"] == s["sparse_rows"] == s["tables"]["features"]["rows"]
        assert servers[s["server"]]["elements"] == s["dense_elements"]
        assert sum(servers[s["server"]]["staleness"].values()) > 0          # async pushes were counted
    plan = json.loads((run / "plan.json").read_text())
    assert sum(x["dense_elements"] for x in plan["servers"]) == 8 * 1 + 4 + 1    # Linear(12, 1)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["totals"]["steps"] == {"0": STEPS, "1": STEPS}
    assert summary["totals"]["sparse_rows"] == sum(s["sparse_rows"] for s in stats)
    assert [p["exit_code"] for p in summary["processes"]] == [0, 0, 0, 0]

    # the report: non-empty PNGs that the page shows
    index = (run / "report/index.html").read_text()
    for png in ("loss.png", "throughput.png", "server_load.png", "phases.png", "staleness.png"):
        data = (run / "report" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000, png
        assert png in index

    # progress on a pipe: plain lines, one per trainer and server
    for who in ("trainer 0: step", "trainer 1: step", "server 0:", "server 1:"):
        assert f"progress | {who}" in r.stdout, who

    # /metrics of server 0, scraped twice by trainer 0 while it trained
    first, second = json.loads((out / "scrapes.json").read_text())
    assert samples(second, "paramshard_server_requests_total") > samples(first, "paramshard_server_requests_total") > 0


def test_report_of_the_run_directory_from_the_command_line(tmp_path):
    run = tmp_path / "run"
    r = launch("--servers", "1", "--trainers", "1", "--run-dir", str(run), str(SCRIPT), "--out",
               str(tmp_path / "out"), "--steps", "10")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert not (run / "report").exists()
    rep = subprocess.run([sys.executable, "-m", "paramshard", "report", str(run)], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert rep.returncode == 0, rep.stderr
    assert Path(rep.stdout.strip().splitlines()[-1]).name == "index.html"
    assert "staleness" in (run / "report/index.html").read_text()       # sync: says there is none


def test_stats_prints_the_servers_of_a_running_job(tmp_path):
    run = tmp_path / "run"
    job = subprocess.Popen([sys.executable, "-m", "paramshard", "launch", "--servers", "2", "--trainers", "1",
                            "--run-dir", str(run), str(SCRIPT), "--out", str(tmp_path / "out"), "--steps", "400"],
                           cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        import time
        deadline = time.monotonic() + 60
        while not (run / "plan.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        r = subprocess.run([sys.executable, "-m", "paramshard", "stats", str(run), "--once"], capture_output=True,
                           text=True, timeout=60, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        assert "server 0:" in r.stdout and "server 1:" in r.stdout and "rows" in r.stdout
    finally:
        import os
        import signal
        os.killpg(job.pid, signal.SIGTERM)
        job.wait(timeout=60)


def test_max_staleness_through_the_launcher(tmp_path, capsys):
    run = tmp_path / "run"
    r = launch("--servers", "2", "--trainers", "2", "--mode", "async", "--max-staleness", "0", "--run-dir", str(run),
               str(SCRIPT), "--out", str(tmp_path / "out"), "--steps", "20")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["staleness"]["max"] == 0 and sum(summary["staleness"]["histogram"].values()) > 0
    code, out, err = cli_in_process(capsys, "launch", "--servers", "1", "--trainers", "1", "--max-staleness", "1",
                                    SCRIPT, "--out", tmp_path)
    assert code != 0 and "--max-staleness 1: bounds async staleness" in err + out


def test_a_run_directory_others_may_write_is_refused_before_any_process_starts(tmp_path):
    """The real command, in a child process: the refusal reaches the user (exit 2, what is wrong
    and how to fix it), and no rank ever started (the script wrote nothing, no log was opened)."""
    run, out = tmp_path / "run", tmp_path / "out"
    run.mkdir()
    run.chmod(0o777)
    r = launch("--servers", "1", "--trainers", "1", "--mode", "async", "--run-dir", str(run), str(SCRIPT),
               "--out", str(out), "--steps", "3", timeout=120)
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"run directory {run} is writable by its group and by every user (mode 0777)" in r.stderr
    assert f"`chmod go-w {run}`" in r.stderr
    assert list(run.iterdir()) == [] and not out.exists()
