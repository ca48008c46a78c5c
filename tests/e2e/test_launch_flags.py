"""`paramshard launch` flag errors name the flag typed, and a script that forgets close() ends cleanly."""
import subprocess
import sys
import re
import textwrap

import pytest

from tests.e2e.in_process import cli_in_process


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
def test_bad_flag_is_reported_under_the_flag_typed(tmp_path, capsys, flags, message):
    script = tmp_path / "train.py"
    script.write_text("")
    code, _, err = cli_in_process(capsys, "launch", *flags, script)
    assert code == 2
    assert message in err
    assert "PARAMSHARD_" not in err and "Traceback" not in err and "invalid" not in err


def test_a_bad_flag_reaches_the_user_of_the_command(tmp_path):
    """The refusals above, as the command prints them: one run of the real command."""
    script = tmp_path / "train.py"
    script.write_text("")
    r = launch("--timeout", "-1", str(script), timeout=30)
    assert r.returncode == 2
    assert "error: --timeout -1: must be > 0 seconds" in r.stderr
    assert "PARAMSHARD_" not in r.stderr and "Traceback" not in r.stderr and "invalid" not in r.stderr


def test_help_shows_an_example(capsys):
    code, out, _ = cli_in_process(capsys, "launch", "--help")
    assert code == 0
    assert "examples:" in out and "paramshard launch --servers 2 --trainers 4" in out


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


def _clock(line: str) -> int:
    """Seconds since midnight of a log line's HH:MM:SS stamp."""
    h, m, s = map(int, re.search(r"\b(\d\d):(\d\d):(\d\d) \[", line).groups())
    return 3600 * h + 60 * m + s


def test_script_without_close_leaves_at_exit_and_the_job_ends_promptly(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(NO_CLOSE)
    r = launch("--servers", "1", "--trainers", "2", str(script), timeout=300)
    output = r.stdout + r.stderr
    assert r.returncode == 0, output
    for t in (0, 1):
        assert f"trainer {t}: close() was not called; closing at exit" in output
        assert f"trainer {t} left" in output
    assert "lost its connection" not in output
    # Had a trainer not left, the server would wait the whole PARAMSHARD_TIMEOUT (120 s) for it
    # after the trainers' exit. Timed by the processes' own log stamps, from the trainers' exit to
    # the server's stop: how long Python and torch take to start on a busy machine is not in it.
    lines = output.splitlines()
    closing = max(_clock(line) for line in lines if "close() was not called" in line)
    stopped = _clock(next(line for line in lines if "server 0 stopped" in line))
    waited = (stopped - closing) % 86400
    assert waited < 60, f"the server stopped {waited} s after the trainers closed: did it wait for one?\n{output}"
