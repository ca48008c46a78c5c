"""The elastic combination matrix (issue 29 item 7): the pairwise covering of what a user combines
with an elastic job, each case run through the CLI as a user would (`paramshard launch`, then
`paramshard scale` while it trains) and held to oracles:

- the job ends 0 and leaves no process behind;
- every record of the file was trained exactly once (the ids each process logged);
- what the servers hold equals what the trainers pushed: the ``count`` table (scripts/matrix_job.py)
  holds, for each record, 1 (async) or 1/n where n trainers pushed the step that trained it (sync:
  the job equals one process whose step k trains exactly those trainers' batches);
- the moves and membership changes asked for happened while the job trained.

Combinations that cannot run are refused at launch (tested in test_refused_combinations);
the covering leaves them out. The whole matrix is behind the ``matrix`` marker
(`pytest -m matrix tests/e2e/test_elastic_matrix.py`); `make test` runs the SMOKE cases.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest

from paramshard.export import load_table

from tests.e2e.allpairs import all_pairs
from tests.e2e.run_job import REPO, processes_marked, rank_pids
from tests.e2e.test_elastic_launch import PARAMSHARD, Job
from tests.e2e.test_elastic_servers import events, wait_for_event

SCRIPT = str(REPO / "tests" / "e2e" / "scripts" / "matrix_job.py")
ROWS = 16000

FACTORS = {
    "mode": ["sync", "async"],
    "prefetch": ["on", "off"],
    "servers": ["none", "up", "up+down"],
    "trainers": ["none", "leave", "join", "kill"],
    "checkpoints": ["off", "on"],
    "recovery": ["rollback", "bounded-loss"],
    "store": ["compiled", "tiered"],
    "rows": ["float32", "bfloat16"],
    "script": ["example", "app"],
}


def runnable(case: dict) -> bool:
    # bounded-loss recovery restores a copy that may be 0.25 s old: sync steps cannot lose pushes,
    # so launch refuses the pair (test_refused_combinations). The CTR app always prefetches and
    # stores float32 rows: it has no switch for either.
    if case["script"] == "app" and (case["prefetch"] == "off" or case["rows"] != "float32"):
        return False
    return not (case["mode"] == "sync" and case["recovery"] == "bounded-loss")


CASES = all_pairs(FACTORS, runnable)


def case_id(case: dict) -> str:
    return "-".join(str(v) if k in ("mode", "script") else f"{k}_{v}" for k, v in case.items()).replace("+", "_")


# Two cases every `make test` runs: the sync job with prefetching that deadlocked on a server
# scale (issue 29), and an async one with a killed trainer, a tiered store and bounded loss.
SMOKE = [
    {"mode": "sync", "prefetch": "on", "servers": "up+down", "trainers": "leave", "checkpoints": "on",
     "recovery": "rollback", "store": "compiled", "rows": "float32", "script": "example"},
    {"mode": "async", "prefetch": "on", "servers": "up+down", "trainers": "kill", "checkpoints": "off",
     "recovery": "bounded-loss", "store": "tiered", "rows": "bfloat16", "script": "example"},
]


def scale(job, what, n):
    done = subprocess.run([PARAMSHARD, "scale", str(job.run_dir), f"--{what}", str(n)], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, f"scale --{what} {n}: {done.stdout}{done.stderr}\n{job.text()[-4000:]}"
    return done.stdout


def launch_flags(case: dict, tmp_path) -> list[str]:
    flags = ["--trainers", "2:3", "--mode", case["mode"], "--partitions", "256", "--max-restarts", "1"]
    if case["checkpoints"] == "on":
        flags += ["--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "40"]
    if case["recovery"] == "bounded-loss":
        flags += ["--recovery", "bounded-loss"]
    if case["store"] == "tiered":
        flags += ["--memory-budget", "64MiB"]
    return flags


def read_logs(folder):
    """{process file: [(step, [ids])]} from the ids-*.txt files."""
    out = {}
    for path in sorted(folder.glob("ids-*.txt")):
        lines = []
        for line in path.read_text().splitlines():
            step, _, ids = line.partition(":")
            lines.append((int(step), [int(x) for x in ids.split()]))
        out[path.name] = lines
    return out


def check_oracles(case: dict, logs):
    per_process = read_logs(logs)
    trained = [i for lines in per_process.values() for _, ids in lines for i in ids]
    assert sorted(trained) == list(range(ROWS)), \
        f"{len(trained)} records trained, {len(set(trained))} distinct, of {ROWS}"
    counts = load_table(logs / "count.npz")
    held = dict(zip(counts.ids.tolist(), counts.values[:, 0].tolist()))
    if case["mode"] == "async":
        expected = dict.fromkeys(range(ROWS), 1.0)
    else:
        pushers: dict[int, int] = {}
        for lines in per_process.values():
            for step in {s for s, _ in lines}:
                pushers[step] = pushers.get(step, 0) + 1
        expected = {i: 1.0 / pushers[step] for lines in per_process.values() for step, ids in lines for i in ids}
    tolerance = 4e-3 if case["rows"] == "bfloat16" else 1e-6
    wrong = {i: (held.get(i), want) for i, want in expected.items() if abs(held.get(i, 0.0) - want) > tolerance}
    assert not wrong, f"{len(wrong)} records applied other than once by the servers, e.g. " \
                      f"{dict(list(wrong.items())[:8])} (id: (held, expected))"


def scale_while_training(job, case: dict, at: int) -> int:
    """The case's moves and membership changes, in order: a kill, servers up, a leave or a join,
    servers down. Returns the number of moves."""
    moves = 0
    if case["trainers"] == "kill":
        # First: a trainer paused between two steps holds a sync job's step until it is killed
        # (and no move could reach its switch step meanwhile).
        at = job.wait_for(r"trainer 1 ready to be killed", at, deadline=60) if case["script"] == "example" else at
        [victim] = rank_pids(job.mark, "trainer", 1)
        os.kill(victim, signal.SIGKILL)
        at = job.wait_for(r"a new process takes slot 1 and joins the running job", at)
    if case["servers"] != "none":
        assert "started servers [2]" in scale(job, "servers", 3)
        moves += 1
        wait_for_event(job, "scale_end", moves)
    if case["trainers"] in ("leave", "join"):
        assert "asked trainers [2] to leave" in scale(job, "trainers", 2)
        at = job.wait_for(r"trainer 2 left on request", at)
        if case["trainers"] == "join":
            assert "starting trainers [2]" in scale(job, "trainers", 3)
            at = job.wait_for(r"trainer 2 (first step [1-9]\d*|joined the running job)", at)
    if case["servers"] == "up+down":
        assert "moving the partitions of servers [2]" in scale(job, "servers", 2)
        moves += 1
        wait_for_event(job, "scale_end", moves)
    assert job.proc.poll() is None, f"the job ended before the moves were done:\n{job.text()[-4000:]}"
    return moves


def end_cleanly(job):
    code = job.proc.wait(timeout=180)
    assert code == 0, job.text()[-6000:]
    end = time.monotonic() + 10
    while processes_marked(job.mark) and time.monotonic() < end:
        time.sleep(0.1)
    assert not processes_marked(job.mark), f"processes left over: {processes_marked(job.mark)}"


APP_EPOCHS = 8


def run_app_case(case: dict, tmp_path):
    """The CTR app (-m paramshard.apps.ctr) with its --trained-log: every epoch's rows and their id
    checksum, over all processes, equal one static pass of --train (a killed process logs nothing of
    its last epoch, so with a kill only the job's end and its epochs are checked)."""
    from tests.e2e.test_ctr_app import elastic_data, one_pass
    schema = elastic_data(tmp_path)
    log, out = tmp_path / "trained", tmp_path / "out.json"
    job = Job(tmp_path, *launch_flags(case, tmp_path), servers="2", script="-m", args=[
        "paramshard.apps.ctr", "--train", str(tmp_path / "train.csv"), "--test", str(tmp_path / "test.csv"),
        "--schema", str(tmp_path / "s.json"), "--model", "widedeep", "--epochs", str(APP_EPOCHS), "--patience", "0",
        "--lr-decay", "1", "--batch-size", "16", "--task-bytes", "3000", "--trained-log", str(log),
        "--json", str(out)])
    try:
        at = job.wait_for(r"epoch 1: train loss", deadline=150)
        moves = scale_while_training(job, case, at)
        end_cleanly(job)
    finally:
        job.close()
    assert len(events(job.run_dir, "scale_end")) == moves
    result = json.loads(out.read_text())
    assert [e["epoch"] for e in result["epochs"]] == list(range(1, APP_EPOCHS + 1)), result["epochs"]
    if case["trainers"] == "kill":
        return
    rows, checksum, _ = one_pass(tmp_path, schema)
    records = [json.loads(line) for p in sorted(log.glob("trained-*.jsonl")) for line in p.read_text().splitlines()]
    for epoch in range(1, APP_EPOCHS + 1):
        mine = [r for r in records if r["epoch"] == epoch]
        got = (sum(r["rows"] for r in mine), sum(r["id_sum"] for r in mine) % (1 << 64))
        assert got == (rows, checksum), f"epoch {epoch}: {got} trained, one pass is {(rows, checksum)}"


def run_case(case: dict, tmp_path):
    if case["script"] == "app":
        return run_app_case(case, tmp_path)
    data = tmp_path / "d.svm"
    data.write_text("".join(f"{i % 2} {i}:1\n" for i in range(ROWS)))
    logs, hold = tmp_path / "ids", tmp_path / "hold"
    logs.mkdir()
    hold.touch()
    args = [str(data), str(logs), str(hold), "--prefetch", case["prefetch"], "--dtype", case["rows"]]
    if case["trainers"] == "kill":
        args += ["--pause-at", "30"]
    job = Job(tmp_path, *launch_flags(case, tmp_path), servers="2", script=SCRIPT, args=args)
    try:
        at = max(job.wait_for(rf"trainer {t} at step \d+", deadline=90) for t in range(3))
        moves = scale_while_training(job, case, at)
        hold.unlink()
        end_cleanly(job)
    finally:
        job.close()
    check_oracles(case, logs)
    ended = [e for e in events(job.run_dir, "scale_end")]
    assert len(ended) == moves, ended
    if case["checkpoints"] == "on":
        assert list((tmp_path / "ckpt").glob("step-*")), "no checkpoint written"


@pytest.mark.parametrize("case", SMOKE, ids=case_id)
@pytest.mark.timeout(300)
def test_smoke_combinations(case, tmp_path):
    run_case(case, tmp_path)


@pytest.mark.matrix
@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.timeout(300)
def test_combination(case, tmp_path):
    run_case(case, tmp_path)


@pytest.mark.timeout(60)
def test_refused_combinations(tmp_path):
    """What cannot combine is refused at launch, with the reason, before any process starts."""
    done = subprocess.run([PARAMSHARD, "launch", "--servers", "2", "--trainers", "2", "--mode", "sync",
                           "--recovery", "bounded-loss", "--max-restarts", "1", "--run-dir", str(tmp_path / "run"),
                           SCRIPT, "x", "y", "z"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode != 0 and "bounded-loss" in done.stderr and "async" in done.stderr, done.stderr


def test_the_covering_holds_every_allowed_pair():
    """Every pair of values that some runnable combination holds is in a case (counted here by
    brute force, not by allpairs' own bookkeeping), and every case is runnable."""
    import itertools
    names = list(FACTORS)
    runnable_cases = [dict(zip(names, v)) for v in itertools.product(*FACTORS.values())
                      if runnable(dict(zip(names, v)))]
    for a, b in itertools.combinations(names, 2):
        wanted = {(c[a], c[b]) for c in runnable_cases}
        covered = {(c[a], c[b]) for c in CASES}
        assert wanted <= covered, (a, b, wanted - covered)
    assert all(runnable(c) for c in CASES)
    assert ("sync", "bounded-loss") not in {(c["mode"], c["recovery"]) for c in CASES}
    assert len(CASES) <= 20, len(CASES)
