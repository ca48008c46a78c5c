"""`paramshard launch` flag errors name the flag typed, and a script that forgets close() ends cleanly."""
import subprocess
import sys
import textwrap
import time

import pytest


def launch(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "paramshard", "launch", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("flags,message", [
    (["--timeout", "-1"], "error: --timeout -1: must be > 0 seconds"),
    (["--timeout=0"], "error: --timeout 0: must be > 0 seconds"),
    (["--timeout", "nan"], "error: --timeout nan: must be a finite number > 0 seconds"),
    (["--timeout", "soon"], "error: --timeout soon: not a number of seconds"),
    (["--min-block-size", "0"], "error: --min-block-size 0: must be >= 1"),
    (["--min-block-size", "1.5"], "error: --min-block-size 1.5: not a whole number"),
    (["--servers", "10.0.0.1:6174,10.0.0.2:6174"],
     'error: --servers takes a number of servers; to run on several machines use '
     '--hosts 10.0.0.1,10.0.0.2 (see README "Many machines")'),
    (["--servers", "two"], "error: --servers two: not a number"),
])
def test_bad_flag_is_reported_under_the_flag_typed(tmp_path, flags, message):
    script = tmp_path / "train.py"
    script.write_text("")
    r = launch(*flags, str(script), timeout=30)
    assert r.returncode == 2
    assert message in r.stderr
    assert "PARAMSHARD_" not in r.stderr and "Traceback" not in r.stderr and "invalid" not in r.stderr


def test_help_shows_an_example():
    r = launch("--help", timeout=30)
    assert r.returncode == 0
    assert "examples:" in r.stdout and "paramshard launch --servers 2 --trainers 4" in r.stdout


NO_CLOSE = textwrap.dedent("""
    import torch, torch.nn as nn
    import paramshard as ps
    env = ps.init()
    model = nn.Linear(4, 2)
    trainer = ps.Trainer(model, ps.optim.SGD(lr=0.1))
    for _ in range(2):
        trainer.step(model(torch.ones(2, 4)).pow(2).mean())
    print("trained", env.trainer_id)
""")


def test_script_without_close_leaves_at_exit_and_the_job_ends_promptly(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(NO_CLOSE)
    start = time.monotonic()
    r = launch("--servers", "1", "--trainers", "2", str(script))
    elapsed = time.monotonic() - start
    output = r.stdout + r.stderr
    assert r.returncode == 0, output
    for t in (0, 1):
        assert f"trainer {t}: close() was not called; closing at exit" in output
        assert f"trainer {t} left" in output
    assert "lost its connection" not in output
    # Had a trainer not left, the servers would wait the whole PARAMSHARD_TIMEOUT (120 s) for it:
    # the bound tells the two apart without timing the machine's speed.
    assert elapsed < 40, f"job took {elapsed:.1f} s: did the servers wait for a trainer?\n{output}"
