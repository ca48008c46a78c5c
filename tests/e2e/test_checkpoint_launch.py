"""Checkpoints through `paramshard launch`: stop and --resume, and a server killed
with -9 under --max-restarts, both end bit-identical to an undisturbed run."""
import json
import os
import re
import signal
import subprocess
import time

import pytest

from tests.e2e.in_process import cli_in_process
from tests.e2e.run_job import MARK, PARAMSHARD, REPO, VENV_BIN, processes_marked, rank_pids

SCRIPT = str(REPO / "tests" / "e2e" / "scripts" / "resumable.py")


def launch(*args, timeout=120):
    r = subprocess.run([PARAMSHARD, "launch", "--servers", "2", "--trainers", "2", *args],
                       capture_output=True, text=True, timeout=timeout, cwd=REPO,
                       env={**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"})
    return r.returncode, r.stdout + r.stderr


def final_hash(output):
    found = re.findall(r"final ([0-9a-f]{64})", output)
    assert len(found) == 1, output[-4000:]
    return found[0]


@pytest.fixture(scope="module")
def whole_16():
    """The final model of the undisturbed 16-step run: the oracle of every disturbed run below."""
    code, whole = launch(SCRIPT, "--steps", "16")
    assert code == 0, whole[-4000:]
    return final_hash(whole)


def test_stop_then_resume_equals_one_run(tmp_path, whole_16):
    ckpt = tmp_path / "ckpt"
    code, first = launch("--checkpoint-dir", str(ckpt), SCRIPT, "--steps", "16", "--stop-at", "5")
    assert code == 0, first[-4000:]
    assert (ckpt / "step-00000005" / "manifest.json").is_file()       # the final checkpoint of the first run
    code, second = launch("--checkpoint-dir", str(ckpt), "--resume", SCRIPT, "--steps", "16")
    assert code == 0, second[-4000:]
    assert "trainer 1 starts at step 5" in second, second[-4000:]
    assert final_hash(second) == whole_16          # the undisturbed run's final model (the module's oracle)
    assert (ckpt / "step-00000016").is_dir()


def test_resume_from_nothing_is_an_error_naming_the_directory(tmp_path, capsys):
    code, out, err = cli_in_process(capsys, "launch", "--servers", "2", "--trainers", "2", "--checkpoint-dir",
                                    tmp_path / "none", "--resume", SCRIPT)
    assert code == 2 and f"checkpoint {tmp_path / 'none'} does not exist" in err, out + err


def _launch_with_restarts(ckpt, mark: str, every: int, steps: int, delay: float, *flags: str) -> subprocess.Popen:
    """A 2 + 2 job of SCRIPT with checkpoints every ``every`` steps and --max-restarts 1 (and
    the launcher's ``flags``); its processes carry ``mark`` (run_job.processes_marked finds them)."""
    return subprocess.Popen([PARAMSHARD, "launch", "--servers", "2", "--trainers", "2", "--checkpoint-dir", str(ckpt),
                             "--checkpoint-every", str(every), "--max-restarts", "1", *flags, SCRIPT, "--steps", str(steps),
                             "--step-delay", str(delay)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO, env={**os.environ, MARK: mark, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"},
                            start_new_session=True)


def _kill_mid_run(tmp_path, role, rank, sig=signal.SIGKILL, *flags):
    """Run the 16-step job (0.3 s a step) with checkpoints every 5 steps and --max-restarts 1;
    0.6 s after step 5 is saved (about step 7, well before the next checkpoint), send ``sig``
    (kill -9) to the given rank. Returns (exit code, output)."""
    ckpt = tmp_path / "ckpt"
    mark = f"kill-test-{time.time_ns()}"
    proc = _launch_with_restarts(ckpt, mark, 5, 16, 0.3, *flags)
    victims = []
    try:
        deadline = time.monotonic() + 60
        while not (ckpt / "step-00000005").is_dir():
            assert time.monotonic() < deadline and proc.poll() is None, "no checkpoint at step 5 in time"
            time.sleep(0.05)
        time.sleep(0.6)
        victims = rank_pids(mark, role, rank)
        assert len(victims) == 1, victims
        os.kill(victims[0], sig)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in victims if sig == signal.SIGSTOP else ():
            try:
                os.kill(pid, signal.SIGKILL)      # never leave a stopped process behind
            except ProcessLookupError:
                pass
    assert not processes_marked(mark)
    return proc.returncode, out


def test_a_killed_server_is_restarted_in_place_and_the_trainers_carry_on(tmp_path, whole_16):
    run = tmp_path / "run"
    code, out = _kill_mid_run(tmp_path, "server", 1, signal.SIGKILL, "--run-dir", str(run))
    assert code == 0, out[-6000:]
    # The run directory: the restart among its events (which server, when, why), and server 1's
    # counters as job totals across its two processes (no negative rate, no false imbalance).
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    restarts = [r for r in records if r["kind"] == "event" and r["event"] == "restart"]
    assert [r["rank"] for r in restarts] == ["server 1"], restarts
    assert "restarting it in place" in restarts[0]["text"] and restarts[0]["t"] > records[0]["t"]
    mine = [r for r in records if r["kind"] == "server" and r["server"] == 1]
    assert all(r["requests_per_s"] is None or r["requests_per_s"] >= 0 for r in mine), mine
    totals = [r["requests"] for r in mine]
    assert totals == sorted(totals) and mine[-1]["restarts"] == 1, mine
    assert "restarting it in place on 127.0.0.1:" in out, out[-6000:]
    replayed = re.findall(r"trainer (\d): rolled back from step (\d+) to checkpoint step (\d+): (\d+) steps", out)
    assert {t for t, *_ in replayed} == {"0", "1"}, out[-6000:]
    assert all(int(back_to) == 5 and int(n) >= 1 for _, _, back_to, n in replayed), replayed   # steps replayed
    # The trainers were not restarted: each script started once.
    assert out.count("trainer 0 starts at step") == 1 and out.count("trainer 1 starts at step") == 1, out[-6000:]
    assert final_hash(out) == whole_16


def test_a_hung_server_is_killed_and_restarted_in_place_for_one_restart(tmp_path, whole_16):
    """SIGSTOP server 1 for good (longer than the timeout): server 0 names it in its status
    lines, the launcher SIGKILLs it and restarts it alone, one restart spent, and the job ends
    as an undisturbed run does. The timeout, 20 s, is the trainers' deadline for the servers to
    come back (a busy machine takes seconds to start one); under the 5 s heartbeat it would fail
    their requests with DeadlineExceeded before they see the server gone."""
    code, out = _kill_mid_run(tmp_path, "server", 1, signal.SIGSTOP, "--timeout", "20")
    assert code == 0, out[-6000:]
    assert re.search(r"server 1 \(pid \d+ on this machine\) is hung: server 0 lost its heartbeat, and it has said "
                     r"nothing to the launcher for [\d.]+ s: killing it \(SIGKILL\)", out), out[-6000:]
    # One restart, for server 1 alone: server 0 did not exit, the job was not restarted whole.
    restarts = re.findall(r"(server \d) was hung and is killed; restarting it in place on 127\.0\.0\.1:\d+ "
                          r"\(restart (\d+)\)", out)
    assert restarts == [("server 1", "1")], out[-6000:]
    assert out.count("restarting it in place") == 1, out[-6000:]
    assert "every server and trainer starts again" not in out and "first failure" not in out, out[-6000:]
    assert re.search(r"restarted in place: restart 1: server 1 \(hung: server 0 lost its heartbeat", out), out[-6000:]
    replayed = re.findall(r"trainer (\d): rolled back from step (\d+) to checkpoint step (\d+)", out)
    assert {t for t, *_ in replayed} == {"0", "1"}, out[-6000:]
    assert out.count("trainer 0 starts at step") == 1 and out.count("trainer 1 starts at step") == 1, out[-6000:]
    assert final_hash(out) == whole_16


def test_a_killed_trainer_restarts_the_job_from_the_latest_checkpoint(tmp_path, whole_16):
    code, out = _kill_mid_run(tmp_path, "trainer", 1)
    assert code == 0, out[-6000:]
    assert re.search(r"restart 1 of 1: every server and trainer starts again from checkpoint step \d+", out), out
    assert final_hash(out) == whole_16


SURVIVOR = str(REPO / "tests" / "e2e" / "scripts" / "async_survivor.py")


def test_async_goes_on_without_a_dead_trainer_with_min_trainers():
    code, out = launch("--trainers", "3", "--mode", "async", "--min-trainers", "2", SURVIVOR, "--fail-trainer", "1")
    assert code == 0, out[-4000:]
    assert "training continues with 2 trainers (at least 2: --trainers 2:3)" in out, out[-4000:]
    assert "trainer 0 done" in out and "trainer 2 done" in out, out[-4000:]
    assert re.search(r"server 0: every trainer ended, 2 left normally; lost: \[1\]", out), out[-4000:]


def test_without_min_trainers_a_dead_trainer_stops_the_job():
    code, out = launch("--trainers", "3", "--mode", "async", SURVIVOR, "--fail-trainer", "1")
    assert code == 3, out[-4000:]
    assert "first failure: trainer 1" in out, out[-4000:]


def test_min_trainers_needs_a_server_mode(capsys):
    code, out, err = cli_in_process(capsys, "launch", "--servers", "0", "--trainers", "2", "--min-trainers", "1",
                                    "--mode", "collective", SURVIVOR)
    assert code == 2 and "an elastic job needs --mode sync, async or geo" in err, out + err


def test_a_server_dead_before_the_first_checkpoint_fails_the_job_fast(tmp_path):
    """--max-restarts with nothing to roll back to: no restart, the job fails naming the server."""
    ckpt = tmp_path / "ckpt"
    mark = f"early-kill-{time.time_ns()}"
    proc = _launch_with_restarts(ckpt, mark, every=1000, steps=200, delay=0.05)
    try:
        deadline = time.monotonic() + 60
        while "starts at step 0" not in _peek(proc):
            assert time.monotonic() < deadline and proc.poll() is None, "the job did not start"
            time.sleep(0.05)
        victim = rank_pids(mark, "server", 0)
        killed_at = time.monotonic()
        os.kill(victim[0], signal.SIGKILL)
        proc.wait(timeout=60)
        took = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = _peek(proc) + proc.stdout.read()
    assert proc.returncode != 0, out[-4000:]
    assert "no checkpoint in" in out and "first failure: server 0" in out, out[-4000:]
    assert took < 30, took
    assert not processes_marked(mark)


_seen: dict = {}


def _peek(proc) -> str:
    """What ``proc`` printed so far (non-blocking reads of its stdout pipe)."""
    import fcntl
    fd = proc.stdout.fileno()
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    try:
        chunk = os.read(fd, 1 << 20)
    except BlockingIOError:
        chunk = b""
    _seen[proc.pid] = _seen.get(proc.pid, "") + chunk.decode(errors="replace")
    return _seen[proc.pid]
