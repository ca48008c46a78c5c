"""`paramshard launch --fork` (launch/engines/fork_server.py): a job whose ranks are forked from one
pre-imported interpreter passes its own oracle, and a forked rank killed from outside ends the
job as an unforked one does (the same status and summary), with nothing left behind."""
import os
import re
import signal
import subprocess
import time

from tests.e2e.run_job import MARK, ORACLE, PARAMSHARD, REPO, VENV_BIN, processes_marked, rank_pids, run_job


def test_a_forked_job_passes_its_oracle():
    """With a zygote of the launcher's own (the suite's other jobs fork from its shared host:
    the kill test below)."""
    result = run_job([PARAMSHARD, "launch", "--fork", "--servers", "2", "--trainers", "2", ORACLE, "--steps", "3"],
                     env={"PARAMSHARD_FORK_SERVER": ""}, timeout=180)
    assert result.code == 0, result
    assert all(f"trainer {i} of 2: oracle ok after 3 steps" in result.output for i in range(2)), result
    assert re.search(r"--fork: fork server \(pid \d+\) ready", result.output), result
    assert "starts as a new process" not in result.output, result        # every rank was forked
    assert result.leftovers == [], result


def forked_children(zygote: int) -> list[int]:
    with open(f"/proc/{zygote}/task/{zygote}/children") as f:
        return [int(pid) for pid in f.read().split()]


def test_a_killed_forked_rank_ends_the_job_as_an_unforked_one(tmp_path):
    """PARAMSHARD_FORK=1 (the suite's switch); 1 server + 1 trainer, both forked. SIGKILL the
    trainer: exit status 137 and the same summary as an unforked rank's (test_root_cause.py)."""
    mark, log_path = f"fork-kill-{time.time_ns()}", tmp_path / "out.txt"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen([PARAMSHARD, "launch", "--servers", "1", "--trainers", "1",
                                 str(REPO / "tests" / "e2e" / "scripts" / "resumable.py"), "--steps", "1000",
                                 "--step-delay", "0.1"], stdout=log_file, stderr=subprocess.STDOUT, cwd=tmp_path,
                                env={**os.environ, MARK: mark, "PARAMSHARD_FORK": "1",
                                     "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "starts at step 0" not in log_path.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, log_path.read_text()[-4000:]
            time.sleep(0.1)
        zygote = int(re.search(r"fork server \(pid (\d+)\) ready", log_path.read_text()).group(1))
        # The tests' rank finder reads /proc/PID/environ: a forked rank shows its own there.
        [server] = rank_pids(mark, "server", 0)
        [trainer] = rank_pids(mark, "trainer", 0)
        assert forked_children(zygote) == [server, trainer], log_path.read_text()[-3000:]
        os.kill(trainer, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = log_path.read_text()
    assert proc.returncode == 128 + signal.SIGKILL, out[-4000:]
    assert f"trainer 0 (pid {trainer}) was killed by SIGKILL" in out, out[-4000:]
    assert re.search(rf"first failure: trainer 0 \(killed by SIGKILL; pid {trainer} on this machine\)", out), \
        out[-4000:]
    deadline = time.monotonic() + 10
    while processes_marked(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_marked(mark)               # the server, and the zygote, are gone too
