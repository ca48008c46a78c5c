"""`paramshard scale RUN_DIR --servers N` on a running local job launched with --partitions:
a third server starts and takes its share of the sparse partitions and dense blocks while the
trainers train, then gives it back, then server 1 (one of the job's first two) gives its share
to server 0; the run directory records the moves and the membership. (The exact sums
across such moves are tests/integration/test_server_scaling.py's.)"""
import json
import subprocess
import time

import pytest

from tests.e2e.test_elastic_launch import PARAMSHARD, REPO, Job

SCRIPT = str(REPO / "tests" / "e2e" / "scripts" / "elastic_sparse.py")


def events(run_dir, kind):
    path = run_dir / "metrics.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("event") == kind] \
        if path.exists() else []


def wait_for_event(job, kind, count, deadline=60.0):
    end = time.monotonic() + deadline
    while len(events(job.run_dir, kind)) < count:
        assert time.monotonic() < end and job.proc.poll() is None, f"no {kind} #{count}:\n{job.text()[-4000:]}"
        time.sleep(0.1)
    return events(job.run_dir, kind)


def scale(job, n, ok=True):
    done = subprocess.run([PARAMSHARD, "scale", str(job.run_dir), "--servers", str(n)], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert (done.returncode == 0) == ok, done.stderr
    return done.stdout + done.stderr


GONE = r"(no trainer routes to them any more|they stopped by themselves once no trainer was connected to them)"


@pytest.mark.timeout(150)
def test_scale_servers_up_and_down_while_the_trainers_train(tmp_path):
    job = Job(tmp_path, "--servers", "2", "--trainers", "2", "--mode", "async", "--partitions", "256",
              servers=None, script=SCRIPT)
    try:
        at = max(job.wait_for(rf"trainer {t} at step \d+", deadline=90) for t in range(2))
        assert "keeps at least one server" in scale(job, 0, ok=False)
        assert "started servers [2]" in scale(job, 3)
        (up,) = wait_for_event(job, "scale_end", 1)
        assert up["servers_before"] == [0, 1] and up["servers_after"] == [0, 1, 2] and up["partitions"] > 0
        at = job.wait_for(r"trainer 0 at step \d+", at)          # still training after the move
        shown = subprocess.run([PARAMSHARD, "stats", str(job.run_dir), "--once"], capture_output=True, text=True,
                               timeout=60, cwd=REPO)
        assert shown.returncode == 0 and [line.split(":")[0] for line in shown.stdout.splitlines()] == \
            ["server 0", "server 1", "server 2"], shown.stdout + shown.stderr      # the added one too
        assert "moving the partitions of servers [2]" in scale(job, 2)
        down = wait_for_event(job, "scale_end", 2)[1]
        assert down["servers_after"] == [0, 1] and down["partitions"] == up["partitions"]
        at = job.wait_for(r"trainer 1 at step \d+", at)
        # Issue 29: a removed server exits once every trainer routes without it (it lingered to the end):
        # told to by the launcher, or by itself once every trainer let go of it (whichever comes first).
        job.wait_for(r"servers \[2\] exit: " + GONE)
        assert "moving the partitions of servers [1]" in scale(job, 1)
        last = wait_for_event(job, "scale_end", 3)[2]
        assert last["servers_after"] == [0] and last["blocks"] > 0, last
        job.wait_for(r"trainer 0 at step \d+", at)
        job.wait_for(r"servers \[1\] exit: " + GONE)
        job.stop.touch()
        assert job.proc.wait(timeout=60) == 0, job.text()[-5000:]
    finally:
        job.close()
    changes = [(e["rank"], e["change"], e["live"]) for e in events(job.run_dir, "membership")]
    assert changes == [("server 2", "added", 3), ("server 2", "removed", 2), ("server 1", "removed", 1)], changes
    # the launcher's watcher followed the routing: the added server has records of its own
    assert any(r.get("kind") == "server" and r.get("server") == 2
               for r in map(json.loads, (job.run_dir / "metrics.jsonl").read_text().splitlines()))


def trainer_steps(run_dir) -> dict[int, int]:
    """The latest step each trainer's records in the run directory name."""
    path, steps = run_dir / "metrics.jsonl", {}
    for r in map(json.loads, path.read_text().splitlines() if path.exists() else []):
        if r.get("kind") == "trainer" and "step" in r:
            steps[r["trainer"]] = max(r["step"], steps.get(r["trainer"], 0))
    return steps


def wait_for_steps(job, step, deadline=60.0):
    """Both trainers past ``step`` (a trainer that froze, as one did after a sync switch, never is)."""
    end = time.monotonic() + deadline
    while len(trainer_steps(job.run_dir)) < 2 or min(trainer_steps(job.run_dir).values()) < step:
        assert time.monotonic() < end and job.proc.poll() is None, \
            f"the trainers stopped at {trainer_steps(job.run_dir)}, short of step {step}:\n{job.text()[-4000:]}"
        time.sleep(0.2)


@pytest.mark.timeout(240)
def test_a_sync_job_with_prefetching_scales_2_3_2(tmp_path):
    """examples/ctr_wide_deep.py (trainer.prefetching, two tables, sync) scaled 2 -> 3 -> 2: each move
    changes routing at one step with sparse partitions and dense blocks moving, the trainers go on
    past each switch, and the job ends as an unscaled one does (every step, test AUC, rc 0). Its
    rows equal an unscaled run's: tests/integration/test_server_scaling_sync.py."""
    job = Job(tmp_path, "--trainers", "2", "--mode", "sync", "--partitions", "64", servers="2",
              script=str(REPO / "examples" / "ctr_wide_deep.py"),
              args=["--train-rows", "80000", "--test-rows", "2000", "--batch-size", "64",
                    "--workdir", str(tmp_path / "data")])
    try:
        job.wait_for(r"epoch 1 \[", deadline=120)            # data written, training
        assert "started servers [2]" in scale(job, 3)
        (up,) = wait_for_event(job, "scale_end", 1)
        assert up["servers_after"] == [0, 1, 2] and up["partitions"] > 0 and up["blocks"] > 0, up
        assert up["switch_step"] is not None, up
        wait_for_steps(job, up["switch_step"] + 20)
        assert "moving the partitions of servers [2]" in scale(job, 2)
        down = wait_for_event(job, "scale_end", 2)[1]
        assert down["servers_after"] == [0, 1] and down["partitions"] == up["partitions"] and down["blocks"] > 0
        assert down["switch_step"] is not None and down["switch_step"] > up["switch_step"], down
        wait_for_steps(job, down["switch_step"] + 20)
        assert job.proc.wait(timeout=150) == 0, job.text()[-5000:]
    finally:
        job.close()
    total = 80000 // (64 * 2)
    assert trainer_steps(job.run_dir) == {0: total, 1: total}, trainer_steps(job.run_dir)
    assert "epoch 1: train loss" in job.text() and "gave up" not in job.text(), job.text()[-5000:]
    changes = [(e["rank"], e["change"]) for e in events(job.run_dir, "membership")]
    assert changes == [("server 2", "added"), ("server 2", "removed")], changes
