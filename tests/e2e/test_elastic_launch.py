"""`paramshard launch --trainers 2:3` (local): a killed trainer is replaced alone (the others never
stop), then `paramshard scale RUN_DIR --trainers 2` asks the highest to leave at a step boundary
and `--trainers 3` starts a new one in its slot; the run directory records every change."""
import json
import os
import re
import signal
import subprocess
import time
import uuid

import pytest

from tests.e2e.run_job import MARK, PARAMSHARD, REPO, VENV_BIN, rank_pids

SCRIPT = str(REPO / "tests" / "e2e" / "scripts" / "elastic.py")


class Job:
    def __init__(self, tmp_path, *flags, script=SCRIPT, args=None, servers="1"):
        self.out_path = tmp_path / "out.txt"
        self.run_dir, self.stop = tmp_path / "run", tmp_path / "stop"
        self.mark = uuid.uuid4().hex
        self.out = open(self.out_path, "w")
        self.proc = subprocess.Popen(
            [PARAMSHARD, "launch", *(["--servers", servers] if servers else []), "--run-dir", str(self.run_dir),
             "--timeout", "20", *flags,
             script, *(args if args is not None else [str(self.stop)])],
            stdout=self.out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
            env={**os.environ, MARK: self.mark, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"})

    def text(self) -> str:
        return self.out_path.read_text()

    def wait_for(self, pattern: str, after: int = 0, deadline: float = 40.0) -> int:
        """Wait until ``pattern`` appears in the output past offset ``after``; its end offset."""
        end = time.monotonic() + deadline
        while True:
            found = re.compile(pattern).search(self.text(), after)
            if found:
                return found.end()
            assert time.monotonic() < end and self.proc.poll() is None, \
                f"no {pattern!r} in time:\n{self.text()[-5000:]}"
            time.sleep(0.05)

    def scale(self, n: int) -> str:
        done = subprocess.run([PARAMSHARD, "scale", str(self.run_dir), "--trainers", str(n)], capture_output=True,
                              text=True, timeout=60, cwd=REPO)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.out.close()


@pytest.mark.timeout(150)
def test_a_killed_trainer_is_replaced_alone_and_scale_moves_the_trainers(tmp_path):
    job = Job(tmp_path, "--trainers", "2:3", "--max-restarts", "1", "--checkpoint-dir", str(tmp_path / "ckpt"))
    try:
        at = max(job.wait_for(rf"trainer {t} at step \d+", deadline=90) for t in range(3))
        [victim] = rank_pids(job.mark, "trainer", 1)
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        # The others go on at once (sync: they would block on a required dead trainer)...
        step0 = int(re.findall(r"trainer 0 at step (\d+)", job.text())[-1])
        went_on = job.wait_for(rf"trainer 0 at step ({step0 + 10}|{step0 + 20})\b", at)
        print(f"\ntrainer 0 went on 10 steps in {time.monotonic() - killed:.2f} s after trainer 1 was killed")
        # ...and slot 1 is taken by a new process that joins the running job. Both are looked for
        # from the kill on: a replacement that starts fast (a forked rank) joins before trainer 0
        # has gone on 10 steps.
        job.wait_for(r"a new process takes slot 1 and joins the running job \(restart 1 of 1\)", at)
        joined = job.wait_for(r"trainer 1 first step [1-9]\d*", at)
        at = max(went_on, job.wait_for(r"trainer 1 at step \d+", joined))
        assert "trainer 0 first step" in job.text() and job.proc.poll() is None

        assert "asked trainers [2] to leave" in job.scale(2)
        at = job.wait_for(r"trainer 2 ends at step \d+ \(leave requested: True\)", at)
        job.wait_for(r"trainer 2 left on request \(exit 0\)", at)
        assert "starting trainers [2]" in job.scale(3)
        at = job.wait_for(r"trainer 2 first step [1-9]\d*", at)
        at = job.wait_for(r"trainer 2 at step \d+", at)
        job.stop.touch()
        assert job.proc.wait(timeout=60) == 0, job.text()[-5000:]
    finally:
        job.close()
    records = [json.loads(line) for line in (job.run_dir / "metrics.jsonl").read_text().splitlines()]
    changes = [(r["event"], r.get("change"), r.get("rank"), r["trainers"] if r["event"] == "scale" else r["live"])
               for r in records if r.get("event") in ("membership", "scale")]
    assert changes == [("membership", "replaced", "trainer 1", 3), ("scale", None, None, 2),
                       ("membership", "asked to leave", "trainer 2", 3), ("membership", "left", "trainer 2", 2),
                       ("scale", None, None, 3), ("membership", "joined", "trainer 2", 3)], changes
    assert all(r["role"] == "trainer" for r in records if r.get("event") in ("membership", "scale"))


@pytest.mark.timeout(150)
def test_an_elastic_geo_job_keeps_the_exact_sum_through_a_leave_and_a_join(tmp_path):
    """`--mode geo --geo-k 4 --trainers 1:3`: trainer 2 leaves on `scale --trainers 2` (its round
    in progress sent first), a new process takes its slot on `--trainers 3` (from the merged
    values); the servers end at the initial values minus every gradient any process counted
    (scripts/geo_elastic.py: exact), and the job ends cleanly."""
    import numpy as np
    folder = tmp_path / "sums"
    folder.mkdir()
    job = Job(tmp_path, "--mode", "geo", "--geo-k", "4", "--trainers", "1:3",
              script=str(REPO / "tests" / "e2e" / "scripts" / "geo_elastic.py"), args=[str(folder)])
    job.stop = folder / "stop"
    try:
        _trainer_2_leaves_and_a_new_one_joins(job)
    finally:
        job.close()
    sums = sorted(folder.glob("sum-*.npy"))
    assert len(sums) == 4, (sums, job.text()[-3000:])         # trainers 0, 1, 2 and 2's second process
    want = np.arange(64, dtype=np.int64) - sum(np.load(p) for p in sums)
    np.testing.assert_array_equal(np.load(folder / "final.npy"), want.astype(np.float32))


@pytest.mark.timeout(60)
def test_scale_refuses_clearly(tmp_path):
    job = Job(tmp_path, "--trainers", "2")
    try:
        job.wait_for(r"trainer 1 at step \d+", deadline=45)
        done = subprocess.run([PARAMSHARD, "scale", str(job.run_dir), "--trainers", "3"], capture_output=True,
                              text=True, timeout=60, cwd=REPO)
        assert done.returncode != 0 and "this job is not elastic; launch it with --trainers MIN:MAX" in done.stderr
        done = subprocess.run([PARAMSHARD, "scale", str(job.run_dir), "--servers", "3"], capture_output=True,
                              text=True, timeout=60, cwd=REPO)
        assert done.returncode != 0 and "launch it with --partitions P" in done.stderr, done.stderr
        job.stop.touch()
        assert job.proc.wait(timeout=30) == 0, job.text()[-5000:]
    finally:
        job.close()
    # The job ended: its run directory says so, and scale says it at once (no wait for a launcher).
    asked = time.monotonic()
    done = subprocess.run([PARAMSHARD, "scale", str(job.run_dir), "--servers", "2", "--wait", "60"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2 and re.search(r"the job \S+ ended at .* \(exit code 0, after \d+ s\): there is "
                                              r"nothing to change", done.stderr), done.stderr
    assert time.monotonic() - asked < 30, "scale waited for a launcher of a job that ended"


@pytest.fixture
def ssh_hosts(tmp_path):
    from tests.engines.sshd import SshHosts, require_engines
    require_engines()
    h = SshHosts(workdir=tmp_path / "sshd")
    yield h
    h.close()


@pytest.mark.timeout(150)
def test_over_ssh_scale_down_and_up_start_and_stop_remote_trainers_mid_job(ssh_hosts, tmp_path):
    # The remote ranks import the paramshard this test imports (PYTHONPATH does not cross ssh).
    shim = tmp_path / "python.sh"
    shim.write_text(f"#!/bin/sh\nPYTHONPATH={os.environ.get('PYTHONPATH', '')} exec {VENV_BIN / 'python'} \"$@\"\n")
    shim.chmod(0o755)
    job = Job(tmp_path, "--trainers", "2:3", "--hosts", ",".join(ssh_hosts.addresses), "--ssh-config",
              ssh_hosts.ssh_config, "--remote-python", str(shim))
    try:
        _trainer_2_leaves_and_a_new_one_joins(job)
    finally:
        job.close()


def _trainer_2_leaves_and_a_new_one_joins(job) -> None:
    """Three trainers at work; `scale --trainers 2` asks trainer 2 to leave (it ends at a step
    boundary, exit 0); `--trainers 3` starts a new one in its slot, which trains from a later
    step; then the job is told to stop and ends with exit 0."""
    at = max(job.wait_for(rf"trainer {t} at step \d+", deadline=90) for t in range(3))
    assert "asked trainers [2] to leave" in job.scale(2)
    at = job.wait_for(r"trainer 2 ends at step \d+ \(leave requested: True\)", at)
    at = job.wait_for(r"trainer 2 left on request \(exit 0\)", at)
    assert "starting trainers [2]" in job.scale(3)
    at = job.wait_for(r"trainer 2 first step [1-9]\d*", at)
    job.wait_for(r"trainer 2 at step \d+", at)
    job.stop.touch()
    assert job.proc.wait(timeout=60) == 0, job.text()[-5000:]
