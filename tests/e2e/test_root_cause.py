"""Root cause first: a failed job ends with a summary naming its first failure."""
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from paramshard.launch.api import failure_summary, first_failure
from paramshard.launch.engines.processes import error_excerpt

BOOM = textwrap.dedent("""
    import torch, torch.nn as nn
    import paramshard as ps
    env = ps.init()
    model = nn.Linear(8, 4)
    trainer = ps.Trainer(model, ps.optim.SGD(lr=0.1))
    for step in range(50):
        trainer.step(model(torch.ones(2, 8)).pow(2).mean())
        if env.trainer_id == 1 and step == 1:
            raise RuntimeError("boom from trainer 1")
    trainer.close()
""")

# Many training scripts turn SIGTERM into KeyboardInterrupt (to save a checkpoint on the way out).
SLOW = textwrap.dedent("""
    import os, signal, time, torch, torch.nn as nn
    import paramshard as ps
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    env = ps.init()
    model = nn.Linear(8, 4)
    trainer = ps.Trainer(model, ps.optim.SGD(lr=0.1))
    for step in range(100000):
        trainer.step(model(torch.ones(2, 8)).pow(2).mean())
        if step == 0:
            with open(os.environ["READY_FILE"], "a") as f:
                f.write(f"{env.trainer_id}\\n")
        time.sleep(0.02)
""")


def launch_cmd(script):
    return [sys.executable, "-m", "paramshard", "launch", "--servers", "1", "--trainers", "2", str(script)]


def test_failed_job_ends_with_the_first_failure_and_its_error(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text(BOOM)
    # One stream, as a terminal shows it: the summary must be the last thing printed.
    cmd = launch_cmd(script)
    r = subprocess.run([*cmd[:-1], "--run-dir", str(tmp_path / "run"), cmd[-1]], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=90)
    assert r.returncode == 1, r.stdout
    tail = r.stdout.splitlines()[-8:]
    block = tail[[i for i, line in enumerate(tail) if "first failure:" in line][-1]:]
    assert "first failure: trainer 1 (exit code 1;" in block[0], r.stdout
    assert "    RuntimeError: boom from trainer 1" in block, r.stdout
    assert '        raise RuntimeError("boom from trainer 1")' in block, r.stdout
    # trainer 0 died of trainer 1's death (peer_lost), and is labelled so, not blamed. The launcher
    # stops the job at the first failure, so trainer 0 may be stopped (SIGTERM) before its own
    # peer_lost exit is seen: then it is listed as stopped, and still not blamed.
    labelled = any(line.startswith("  trainer 0: failed after trainer 1 (peer lost") for line in block)
    stopped = re.search(r"then: trainer 0 \(pid \d+\) was killed by SIGTERM", r.stdout) is not None
    assert labelled or stopped, r.stdout
    assert "first failure: trainer 0" not in r.stdout, r.stdout
    assert "stopping the job: trainer 1 failed" in r.stdout
    # `paramshard report RUN_DIR` says the same first: the launcher's failure event in the run directory.
    from paramshard.observe.report.run_result import result_lines
    from paramshard.observe.run_records.run_data import load_run
    lines = result_lines(load_run(tmp_path / "run"))
    assert lines[0].startswith("failed: exit code 1 after "), lines
    assert lines[1].startswith("  first failure: trainer 1 (exit code 1;") and \
        "      RuntimeError: boom from trainer 1" in lines, lines


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stopping_the_launcher_prints_no_trainer_tracebacks(tmp_path, signum):
    script = tmp_path / "slow.py"
    script.write_text(SLOW)
    ready = tmp_path / "ready"
    import os
    proc = subprocess.Popen(launch_cmd(script), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "READY_FILE": str(ready)})
    try:
        deadline = time.monotonic() + 60
        while (not ready.exists() or len(ready.read_text().split()) < 2) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.1)
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signum, out
    assert "Traceback" not in out, out
    # What was left out is said, in one line per process.
    assert "trainer 1: stopped; its traceback is not shown (KeyboardInterrupt)" in out, out
    assert "first failure" not in out, out


def test_error_excerpt_finds_the_last_exception_with_its_context():
    lines = ["12:00:00 [trainer 1] INFO step 3",
             "Traceback (most recent call last):",
             '  File "train.py", line 10, in <module>',
             "    raise ValueError('first')",
             "ValueError: first",
             "",
             "During handling of the above exception, another exception occurred:",
             "",
             "Traceback (most recent call last):",
             '  File "train.py", line 12, in <module>',
             "    raise Boom('second')",
             "Boom: second",
             "  with a second line",
             "12:00:01 [trainer 1] INFO bye"]
    assert error_excerpt(lines) == lines[8:13]
    assert error_excerpt(["a", "", "b", "killed"], tail=2) == ["b", "killed"]
    assert error_excerpt([]) == []


class FakeProcess:
    def __init__(self, tag, code, lines, at, pid=7):
        self.tag, self.code, self.lines, self.at, self.pid = tag, code, lines, at, pid

    def poll(self):
        return self.code

    def error_excerpt(self):
        return error_excerpt(self.lines)

    def failed_at(self):
        return self.at


def test_first_failure_is_not_the_one_that_lost_a_peer():
    peer = FakeProcess("10.0.0.1 | trainer 0", 1, ["paramshard.errors.RemoteError: ... (peer_lost): ..."], at=1.0)
    root = FakeProcess("10.0.0.2 | trainer 1", -9, [], at=2.0)
    other = FakeProcess("server 0", 2, ["Traceback (most recent call last):", "OSError: disk full"], at=3.0)
    assert first_failure([peer, root, other]) is root
    assert first_failure([other, peer]) is other
    summary = failure_summary(root, [peer, other]).splitlines()
    assert summary == ["first failure: trainer 1 (killed by SIGKILL; on 10.0.0.2)",
                       "    (it printed nothing)",
                       "  10.0.0.1 | trainer 0: failed after trainer 1 (peer lost; exit code 1)",
                       "  server 0: failed after trainer 1 (exit code 2): OSError: disk full"]


def test_a_hung_server_is_the_first_failure_not_the_trainers_that_gave_up_on_it(tmp_path):
    """No restarts: SIGSTOP server 1; the trainers fail on the lost heartbeat, and the summary
    names server 1 as hung (from server 0's status lines), killed by the launcher."""
    import os
    import re
    from tests.e2e.run_job import MARK, PARAMSHARD, REPO, VENV_BIN, processes_marked, rank_pids
    mark, log_path = f"hung-summary-{time.time_ns()}", tmp_path / "out.txt"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen([PARAMSHARD, "launch", "--servers", "2", "--trainers", "2",
                                 str(REPO / "tests" / "e2e" / "scripts" / "resumable.py"), "--steps", "1000",
                                 "--step-delay", "0.1"], stdout=log_file, stderr=subprocess.STDOUT, cwd=tmp_path,
                                env={**os.environ, MARK: mark, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"},
                                start_new_session=True)
    victims = []
    try:
        deadline = time.monotonic() + 90
        while log_path.read_text().count("starts at step 0") < 2:
            assert time.monotonic() < deadline and proc.poll() is None, log_path.read_text()[-4000:]
            time.sleep(0.1)
        victims = rank_pids(mark, "server", 1)
        assert len(victims) == 1, victims
        os.kill(victims[0], signal.SIGSTOP)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)      # never leave a stopped process behind
            except ProcessLookupError:
                pass
    out = log_path.read_text()
    assert proc.returncode != 0, out[-4000:]
    assert re.search(r"first failure: server 1 \(hung: server 0 lost its heartbeat, and it has said nothing to the "
                     r"launcher for [\d.]+ s; the launcher killed it: killed by SIGKILL; pid \d+ on this machine\)",
                     out), out[-4000:]
    assert re.search(r"  trainer \d: failed after server 1 \(peer lost", out), out[-4000:]
    assert not processes_marked(mark)
