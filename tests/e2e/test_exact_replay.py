"""Recovery and resume never skip or repeat data (issue 20, defects 11 and 12): the CTR app and
the CTR example train with ``trainer.epochs`` + ``trainer.prefetching``, so a server killed
mid-run in the second epoch (server 0 keeps the named barriers, and the app enters two a
epoch) and ``--resume`` end with exactly the test metrics of an undisturbed run."""
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

PACED = str(REPO / "tests" / "e2e" / "scripts" / "paced.py")
EXAMPLE = str(REPO / "examples" / "ctr_wide_deep.py")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def small_adult(tmp_path_factory):
    """6,000 training and 2,000 test rows of UCI Adult: 11 sync steps of 256 an epoch for 2 trainers."""
    d = tmp_path_factory.mktemp("adult-small")
    subprocess.run([sys.executable, "-m", "paramshard", "dataset", "adult", str(d)], check=True,
                   capture_output=True, timeout=300, cwd=REPO)
    for name, rows in (("train.csv", 6000), ("test.csv", 2000)):
        lines = (d / name).read_text().splitlines(keepends=True)
        (d / name).write_text("".join(lines[:rows + 1]))
    subprocess.run([sys.executable, "-m", "paramshard", "schema", "infer", str(d / "train.csv"), "--label", "income",
                    "-o", str(d / "schema.json")], check=True, capture_output=True, timeout=300, cwd=REPO)
    return d


def app_args(data: Path, out: Path, epochs: int = 3) -> list[str]:
    return ["-m", "paramshard.apps.ctr", "--train", str(data / "train.csv"), "--test", str(data / "test.csv"),
            "--schema", str(data / "schema.json"), "--model", "deepfm", "--epochs", str(epochs), "--batch-size", "256",
            "--json", str(out)]


def example_args(workdir: Path) -> list[str]:
    """2 epochs of 12 steps (2 trainers x 512 rows)."""
    return [EXAMPLE, "--train-rows", "12288", "--test-rows", "4000", "--batch-size", "512", "--epochs", "2",
            "--workdir", str(workdir)]


def start(workload: list[str], *launch_args: str, mark: str = "", delay: float = 0.0) -> subprocess.Popen:
    argv = [PARAMSHARD, "launch", "--servers", "2", "--trainers", "2", *launch_args, PACED, *workload]
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", MARK: mark, "PSTEST_STEP_DELAY": str(delay),
           "PARAMSHARD_TIMEOUT": "15"}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env,
                            start_new_session=True)


def finish(proc, timeout=300) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-6000:]
    return out


def killed_mid_run(workload: list[str], ckpt: Path, server: int, after_step: int) -> str:
    """Run ``workload`` paced, with checkpoints every 4 steps and --max-restarts 1; once the
    checkpoint of ``after_step`` exists, SIGKILL ``server``. Returns the job's output."""
    mark = f"replay-{time.time_ns()}"
    proc = start(workload, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "4", "--max-restarts", "1",
                 mark=mark, delay=0.15)
    try:
        deadline = time.monotonic() + 150
        while not (ckpt / f"step-{after_step:08d}").is_dir():
            assert time.monotonic() < deadline and proc.poll() is None, f"no checkpoint at step {after_step} in time"
            time.sleep(0.05)
        time.sleep(0.3)
        victim = rank_pids(mark, "server", server)
        assert len(victim) == 1, victim
        os.kill(victim[0], signal.SIGKILL)
        log = finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert not processes_marked(mark)
    assert "restarting it in place on" in log, log[-6000:]
    replayed = re.findall(r"trainer (\d): rolled back from step \d+ to checkpoint step \d+: .* the batch loop "
                          r"goes on from epoch 2, batch \d+", log)
    assert sorted(replayed) == ["0", "1"], log[-6000:]
    return log


@pytest.fixture(scope="module")
def app_undisturbed(small_adult, tmp_path_factory):
    out = tmp_path_factory.mktemp("undisturbed") / "result.json"
    finish(start(app_args(small_adult, out)))
    return json.loads(out.read_text())


def test_the_app_with_server_0_killed_in_the_second_epoch_ends_with_the_undisturbed_metrics(
        small_adult, app_undisturbed, tmp_path):
    out = tmp_path / "result.json"
    killed_mid_run(app_args(small_adult, out), tmp_path / "ckpt", server=0, after_step=16)   # epoch 2: steps 11-21
    result = json.loads(out.read_text())
    assert [e["epoch"] for e in result["epochs"]] == [1, 2, 3]
    assert result["final"] == app_undisturbed["final"]


def test_the_app_resumed_after_two_of_three_epochs_trains_exactly_the_third(small_adult, app_undisturbed, tmp_path):
    ckpt, first, second = tmp_path / "ckpt", tmp_path / "first.json", tmp_path / "second.json"
    finish(start(app_args(small_adult, first, epochs=2), "--checkpoint-dir", str(ckpt)))
    log = finish(start(app_args(small_adult, second), "--checkpoint-dir", str(ckpt), "--resume"))
    assert [e["auc"] for e in json.loads(first.read_text())["epochs"]] == \
        [e["auc"] for e in app_undisturbed["epochs"][:2]]
    resumed = json.loads(second.read_text())
    assert "resumed after epoch 2" in log, log[-4000:]
    # The validation history and the best epoch's model came back with the checkpoint: the
    # model selection ends as the undisturbed run's did.
    assert [(e["epoch"], e["valid"], e["auc"]) for e in resumed["epochs"]] == \
        [(e["epoch"], e["valid"], e["auc"]) for e in app_undisturbed["epochs"]]
    assert resumed["best_epoch"] == app_undisturbed["best_epoch"]
    assert resumed["final"] == app_undisturbed["final"]


def test_the_ctr_example_with_a_server_killed_in_the_second_epoch_ends_with_the_undisturbed_auc(tmp_path):
    data = tmp_path / "data"
    undisturbed = finish(start(example_args(data)))
    log = killed_mid_run(example_args(data), tmp_path / "ckpt", server=1, after_step=16)   # epoch 2: steps 12-23
    aucs = re.findall(r"epoch 2: train loss .* test AUC (\d\.\d+)", log)
    assert aucs and aucs[-1] == re.findall(r"epoch 2: train loss .* test AUC (\d\.\d+)", undisturbed)[-1], log[-4000:]
