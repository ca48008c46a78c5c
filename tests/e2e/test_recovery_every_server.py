"""In-place restarts when every server died (issue 20, defect 1): the rollback moves to an epoch
no trainer has seen, so the trainers that are not the chief see it and carry on. The oracle: the
final model is bit-identical to an undisturbed run's."""
import os
import re
import signal
import subprocess
import time

import pytest

from tests.e2e.run_job import MARK, PARAMSHARD, REPO, VENV_BIN, processes_marked, rank_pids

SCRIPT = str(REPO / "tests" / "e2e" / "scripts" / "resumable.py")
STEPS, EVERY = 10, 3


def _run(servers: int, *extra: str, mark: str | None = None, delay: float = 0.0):
    argv = [PARAMSHARD, "launch", "--servers", str(servers), "--trainers", "2", *extra, SCRIPT, "--steps", str(STEPS),
            "--step-delay", str(delay)]
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "PARAMSHARD_TIMEOUT": "15"}
    if mark:
        env[MARK] = mark
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env,
                            start_new_session=True)


def _final(out: str) -> str:
    found = re.findall(r"final ([0-9a-f]{64})", out)
    assert len(found) == 1, out[-5000:]
    return found[0]


@pytest.fixture(scope="module")
def undisturbed() -> str:
    """The final model of the job run without a failure. Sync training does not depend on how
    many servers hold the model, so one run is the oracle of both cases."""
    proc = _run(2)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-4000:]
    return _final(out)


@pytest.mark.parametrize("servers", [1, 2])
def test_every_server_killed_at_once_is_restarted_in_place_and_the_job_ends_as_if_undisturbed(tmp_path, servers,
                                                                                             undisturbed):
    ckpt, mark = tmp_path / "ckpt", f"every-server-{time.time_ns()}"
    proc = _run(servers, "--checkpoint-dir", str(ckpt), "--checkpoint-every", str(EVERY),
                "--max-restarts", str(servers), mark=mark, delay=0.3)
    try:
        deadline = time.monotonic() + 90
        while not (ckpt / f"step-{EVERY:08d}").is_dir():
            assert time.monotonic() < deadline and proc.poll() is None, "no checkpoint in time"
            time.sleep(0.05)
        time.sleep(0.5)
        victims = [pid for s in range(servers) for pid in rank_pids(mark, "server", s)]
        assert len(victims) == servers, victims
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert not processes_marked(mark)
    assert proc.returncode == 0, out[-6000:]
    assert out.count("restarting it in place on") == servers, out[-6000:]
    assert "every server and trainer starts again" not in out, out[-6000:]     # no whole-job restart
    rolled = re.findall(r"trainer (\d): rolled back from step \d+ to checkpoint step (\d+)", out)
    assert sorted(t for t, _ in rolled) == ["0", "1"], out[-6000:]
    assert _final(out) == undisturbed
