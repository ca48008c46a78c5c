"""Recovery and resume never skip or repeat data (issue 20, defects 11 and 12): the CTR app and
the CTR example train with ``trainer.epochs`` + ``trainer.prefetching``, so a server killed
mid-run (server 0, which keeps the named barriers, in the second epoch) and ``--resume`` end
with exactly the test metrics of an undisturbed run."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.run_job import MARK, PARAMSHARD, REPO, VENV_BIN, processes_marked, rank_pids

PACED_APP = str(REPO / "tests" / "e2e" / "scripts" / "paced_ctr_app.py")
EPOCHS, BATCH = 3, 256


@pytest.fixture(scope="module")
def small_adult(tmp_path_factory):
    """6,000 training and 2,000 test rows of UCI Adult: 11 sync steps an epoch for 2 trainers."""
    d = tmp_path_factory.mktemp("adult-small")
    subprocess.run([sys.executable, "-m", "paramshard", "dataset", "adult", str(d)], check=True,
                   capture_output=True, timeout=300, cwd=REPO)
    for name, rows in (("train.csv", 6000), ("test.csv", 2000)):
        lines = (d / name).read_text().splitlines(keepends=True)
        (d / name).write_text("".join(lines[:rows + 1]))
    subprocess.run([sys.executable, "-m", "paramshard", "schema", "infer", str(d / "train.csv"), "--label", "income",
                    "-o", str(d / "schema.json")], check=True, capture_output=True, timeout=300, cwd=REPO)
    return d


pytestmark = pytest.mark.slow


def app(data: Path, out: Path, *launch_args: str, epochs: int = EPOCHS, mark: str = "", delay: float = 0.0):
    argv = [PARAMSHARD, "launch", "--servers", "2", "--trainers", "2", *launch_args, PACED_APP,
            "--train", str(data / "train.csv"), "--test", str(data / "test.csv"), "--schema",
            str(data / "schema.json"), "--model", "deepfm", "--epochs", str(epochs), "--batch-size", str(BATCH),
            "--json", str(out)]
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", MARK: mark, "PSTEST_STEP_DELAY": str(delay),
           "PARAMSHARD_TIMEOUT": "15"}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env,
                            start_new_session=True)


def finish(proc, timeout=240) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-6000:]
    return out


@pytest.fixture(scope="module")
def undisturbed(small_adult, tmp_path_factory):
    out = tmp_path_factory.mktemp("undisturbed") / "result.json"
    finish(app(small_adult, out))
    return json.loads(out.read_text())


@pytest.mark.timeout(400)
def test_server_0_killed_in_the_second_epoch_ends_with_the_undisturbed_metrics(small_adult, undisturbed, tmp_path):
    ckpt, out, mark = tmp_path / "ckpt", tmp_path / "result.json", f"replay-{time.time_ns()}"
    proc = app(small_adult, out, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "4", "--max-restarts", "1",
               mark=mark, delay=0.15)
    try:
        deadline = time.monotonic() + 120
        while not (ckpt / "step-00000016").is_dir():      # epoch 2 is steps 11 to 21
            assert time.monotonic() < deadline and proc.poll() is None, "no checkpoint at step 16 in time"
            time.sleep(0.05)
        time.sleep(0.3)
        victim = rank_pids(mark, "server", 0)
        assert len(victim) == 1, victim
        os.kill(victim[0], signal.SIGKILL)
        log = finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert not processes_marked(mark)
    assert "restarting it in place on" in log, log[-6000:]
    replayed = re.findall(r"trainer (\d): rolled back from step (\d+) to checkpoint step (\d+): .* the batch loop "
                          r"goes on from epoch 2, batch (\d+)", log)
    assert sorted(t for t, *_ in replayed) == ["0", "1"], log[-6000:]
    result = json.loads(out.read_text())
    assert [e["epoch"] for e in result["epochs"]] == [1, 2, 3]
    assert result["final"] == undisturbed["final"]


@pytest.mark.timeout(400)
def test_resume_after_two_of_three_epochs_trains_exactly_the_third(small_adult, undisturbed, tmp_path):
    ckpt = tmp_path / "ckpt"
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    finish(app(small_adult, first, "--checkpoint-dir", str(ckpt), epochs=2))
    log = finish(app(small_adult, second, "--checkpoint-dir", str(ckpt), "--resume"))
    resumed = json.loads(second.read_text())
    assert [e["epoch"] for e in resumed["epochs"]] == [3], log[-4000:]
    assert resumed["final"] == undisturbed["final"]
    assert [e["auc"] for e in json.loads(first.read_text())["epochs"]] == [e["auc"] for e in undisturbed["epochs"][:2]]
