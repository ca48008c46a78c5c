"""`paramshard serve` as a process (one start) against a delta directory made here: it serves the
snapshot, follows a delta published while it runs (the reply's version and scores change
together), reports a gap in /health (and its status file) while serving the version it has, and stops
cleanly on SIGTERM (its status file removed).
The oracle for scores is the replica in this process on the same directory (tests/unit/serving
checks that one against the model file oracle)."""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from paramshard.serving.live_table import StoreChoice
from paramshard.serving.replica import Replica
from tests.unit.serving.delta_dir import change, make_model_dir, publish

pytestmark = pytest.mark.processes      # starts `paramshard serve`: `make test`, not `make check`
SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")
ROWS = [{"price": "3.5", "city": "paris", "tags": "a|b"}, {"price": "12", "city": "rome", "tags": "c"}]
DEADLINE = 60.0


def call(url, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def wait_for(what, check):
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"not within {DEADLINE:g} s: {what}")


def expected_scores(root, upto_seq):
    """What an in-process replica of the directory's files up to ``upto_seq`` answers."""
    replica = Replica(root, StoreChoice("numpy")).start()
    try:
        assert replica.version["servers"] == {"0": upto_seq}
        return replica.score(replica.encoder.from_rows(ROWS))[0].tolist()
    finally:
        replica.close()


def test_serve_process_follows_deltas_and_reports_gaps(tmp_path):
    root = tmp_path / "deltas"
    root.mkdir()
    module = make_model_dir(root)
    from paramshard.serving.rows import RowEncoder
    encoder = RowEncoder(module, root / "model.pt")
    ids = np.unique(encoder.encode(encoder.from_rows(ROWS)).ids.astype(np.uint64))
    publish(root, "snapshot", 0, 0, 0, change(ids, 0.5) | change(ids, 0.5, "wide"))
    at_snapshot = expected_scores(root, 0)
    proc = subprocess.Popen([sys.executable, "-m", "paramshard", "serve", str(root), "--port", "0", "--poll", "0.1", "--status-every", "0.2",
                             "--row-store", "compiled", "--memory-budget", "64MB", "--tier-dir", str(tmp_path / "tier")],
                            env={**os.environ, "PYTHONPATH": os.path.abspath(SRC)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()          # the process prints its URL once it serves
        assert " at http://127.0.0.1:" in line, (line, proc.poll(), proc.stderr.read() if proc.poll() is not None else "")
        url = line.split(" at ", 1)[1].split()[0]
        status, reply = call(url + "/predict", {"rows": ROWS})
        assert status == 200 and reply["version"]["servers"] == {"0": 0}
        assert reply["scores"] == at_snapshot
        # A delta published while it serves: followed, and the reply's scores are that version's.
        publish(root, "delta", 0, 1, 7, change(ids, -1.0) | change(ids, 2.0, "wide"))
        after = expected_scores(root, 1)
        assert after != at_snapshot
        reply = wait_for("the delta applied", lambda: (lambda r: r[1] if r[1]["version"]["servers"] == {"0": 1} else None)(
            call(url + "/predict", {"rows": ROWS})))
        assert reply["scores"] == after and reply["version"]["step"] == 7
        status, health = call(url + "/health")
        assert status == 200 and health["ok"] and health["freshness_s"] >= 0
        # Delta 2 never comes, 3 does: a gap, reported, and the version stays.
        publish(root, "delta", 0, 3, 9, change(ids, 9.0))
        status, health = wait_for("the gap reported", lambda: (lambda r: r if r[0] == 503 else None)(call(url + "/health")))
        assert "delta 2 is missing" in health["errors"]["server 0"] and health["version"]["servers"] == {"0": 1}
        status, reply = call(url + "/predict", {"rows": ROWS})
        assert status == 200 and reply["scores"] == after
        with urllib.request.urlopen(url + "/metrics", timeout=10) as metrics:
            text = metrics.read().decode()
        assert 'paramshard_serve_version_seq{server="0"} 1.0' in text
        # Its status file in the directory (`paramshard report DIR` reads it) says the same.
        from paramshard.online.replica_status import read_statuses
        [replica] = wait_for("a status of the gap", lambda: (lambda found: found if found and not found[0].data["ok"]
                                                            else None)(read_statuses(root, time.time())[0]))
        assert replica.applied == {0: 1} and not replica.stale and replica.data["url"] == url
        assert "delta 2 is missing" in replica.data["errors"]["server 0"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == 0, proc.stderr.read()
    assert list((root / "replicas").iterdir()) == []          # a clean stop removes its status file
    assert not (tmp_path / "tier").exists() or not any(p.suffix == ".rows" for p in (tmp_path / "tier").rglob("*"))
