"""`paramshard launch --mode async --recovery bounded-loss --max-restarts 1`: server 1 is killed
with -9 mid-run; the launcher restarts it, its replica keeper restores the copy, nobody rolls
back, the job ends normally, and the run directory records the copy, the loss and the restore.
(The exact count of what is lost: tests/integration/test_bounded_loss.py.)"""
import json
import os
import signal
import subprocess
import time

import pytest

from tests.e2e.run_job import MARK, PARAMSHARD, REPO, VENV_BIN, processes_marked, rank_pids

SCRIPT = str(REPO / "tests" / "e2e" / "scripts" / "resumable.py")


@pytest.mark.timeout(120)
def test_a_killed_async_server_comes_back_from_the_replica_without_a_rollback(tmp_path):
    mark, run_dir = f"bounded-loss-{time.time_ns()}", tmp_path / "run"
    argv = [PARAMSHARD, "launch", "--mode", "async", "--servers", "2", "--trainers", "2", "--recovery",
            "bounded-loss", "--max-restarts", "1", "--run-dir", str(run_dir), SCRIPT, "--steps", "120",
            "--step-delay", "0.05"]
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "PARAMSHARD_TIMEOUT": "20", MARK: mark}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env,
                            start_new_session=True)
    try:
        records = run_dir / "metrics.jsonl"
        deadline = time.monotonic() + 60
        # Kill once the keeper holds a copy of the registered model and the trainers have made progress.
        while not (records.is_file() and '"trainer"' in records.read_text() and '"first"' in records.read_text()):
            assert time.monotonic() < deadline and proc.poll() is None, "the job did not get going"
            time.sleep(0.05)
        time.sleep(1.0)
        victim = rank_pids(mark, "server", 1)
        assert len(victim) == 1, victim
        os.kill(victim[0], signal.SIGKILL)
        out, _ = proc.communicate(timeout=100)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert not processes_marked(mark)
    assert proc.returncode == 0, out[-6000:]
    assert out.count("restarting it in place on") == 1 and "restores its replica" in out, out[-6000:]
    assert "rolled back" not in out and "steps are trained again" not in out, out[-6000:]
    events = [json.loads(line) for line in records.read_text().splitlines() if '"event"' in line]
    replica = [e for e in events if e["event"] == "replica"]
    restored = [e for e in replica if e.get("what") == "restored"]
    assert len(restored) == 1 and restored[0]["server"] == 1, replica
    assert restored[0]["recovery_s"] < 60 and restored[0]["copy_age_s"] is not None   # 10 s: the benchmark
    assert any(e.get("what") == "refreshes" for e in replica), replica
    print(f"\nserver 1 served again {restored[0]['recovery_s']} s after its death; copy "
          f"{restored[0]['copy_age_s']} s old; ~{restored[0]['updates_lost_estimate']} updates lost")
