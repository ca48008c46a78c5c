"""`paramshard plan` as a user types it: stdout, stderr and exit code. The literal table and one
refusal run the real command in a subprocess; the other cases run the same ``main`` in this
process (the same parser and output, without starting Python and torch for each case)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from paramshard.placement.sharding import ParamSpec, make_plan
from tests.e2e.in_process import cli_in_process


def plan_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "100", "PYTHONIOENCODING": "utf-8", "NO_COLOR": "1"}
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):  # keep rich's output plain
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "paramshard", "plan", *args],
                          capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def plan_here(capsys, monkeypatch):
    """`paramshard plan ARGS` run by this process, in the environment plan_cli gives the command."""
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("NO_COLOR", "1")
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)

    def run(*args: str) -> subprocess.CompletedProcess:
        code, out, err = cli_in_process(capsys, "plan", *args)
        return subprocess.CompletedProcess(["paramshard", "plan", *args], code, out, err)
    return run


MLP = [ParamSpec("fc1.w", (784, 512)), ParamSpec("fc1.b", (512,)), ParamSpec("fc2.w", (512, 10)),
       ParamSpec("fc2.b", (10,))]
MLP_ARGS = ["--param", "fc1.w=784x512", "--param", "fc1.b=512", "--param", "fc2.w=512x10", "--param", "fc2.b=10"]


@pytest.mark.parametrize("extra, kwargs", [
    ([], {}),
    (["--dispatch", "hash", "--min-block-size", "1000"], dict(dispatch="hash", min_block_size=1000)),
    (["--dispatch", "balanced"], dict(dispatch="balanced")),
    (["--dispatch", "legacy_v1"], dict(dispatch="legacy_v1")),
    # for legacy_v1 an explicit --min-block-size is the block size
    (["--dispatch", "legacy_v1", "--min-block-size", "5000"], dict(dispatch="legacy_v1", legacy_block_size=5000)),
])
def test_json_equals_make_plan(plan_here, extra, kwargs):
    proc = plan_here("--servers", "3", *MLP_ARGS, *extra, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == make_plan(MLP, 3, **kwargs).to_json()


# 1000x10 on 2 servers, min 1000: max_split 10, split 2, block 5000 (already whole rows);
# fc.b is one block. Round robin: 0, 1, 0 -> 5010 and 5000 elements; 5010 * 4 B = 0.019 MiB;
# shares 50.05% and 49.95% both print as 50.0%; max/mean = 5010 / 5005 = 1.001.
EXPECTED_TABLE = """\
       3 blocks on 2 servers (round_robin)

  block         offset   size    shape   server
 """ + "─" * 47 + """
  fc.w.block0        0   5000   500x10        0
  fc.w.block1     5000   5000   500x10        1
  fc.b.block0        0     10       10        0

            server load (float32)

  server   blocks   elements     MiB   share
 """ + "─" * 44 + """
       0        2       5010   0.019   50.0%
       1        1       5000   0.019   50.0%

load max/mean: 1.001 (1.000 is perfectly even)
"""


@pytest.mark.parametrize("where", ["subprocess", "in process"])
def test_table_literal(plan_here, where):
    args = ("--servers", "2", "--param", "fc.w=1000x10", "--param", "fc.b=10", "--min-block-size", "1000")
    proc = plan_cli(*args) if where == "subprocess" else plan_here(*args)
    assert proc.returncode == 0, proc.stderr
    assert "\n".join(line.rstrip() for line in proc.stdout.splitlines()) + "\n" == EXPECTED_TABLE


@pytest.mark.parametrize("dispatch", ["round_robin", "balanced"])
def test_table_mentions_every_server_and_the_ratio(plan_here, dispatch):
    proc = plan_here("--servers", "5", "--dispatch", dispatch, *MLP_ARGS)
    assert proc.returncode == 0, proc.stderr
    plan = make_plan(MLP, 5, dispatch)
    load_table = proc.stdout.split("server load")[1]
    for server, elements in enumerate(plan.server_elements()):
        assert re.search(rf"^\s+{server}\s+\d+\s+{elements}\s", load_table, re.M), (server, proc.stdout)
    assert f"load max/mean: {plan.load_ratio():.3f}" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--servers", "2", "--param", "w=10x"], "shape '10x' is not dimensions joined by 'x'"),
    (["--servers", "2", "--param", "w=10x-3"], "negative dimension"),
    (["--servers", "2", "--param", "w"], "is not NAME=SHAPE"),
    (["--servers", "2", "--param", "w=3", "--param", "w=4"], "given twice"),
    (["--servers", "0", "--param", "w=10"], "--servers 0: need at least 1 server"),
    (["--servers", "2", "--param", "w=10", "--min-block-size", "0"], "--min-block-size 0: must be >= 1"),
    (["--servers", "2", "--param", "w=10", "--dispatch", "random"], "invalid choice: 'random'"),
    (["--servers", "2"], "pass at least one --param NAME=SHAPE"),
    (["--param", "w=10"], "the following arguments are required: --servers"),
    (["--servers", "two", "--param", "w=10"], "invalid int value: 'two'"),
])
def test_bad_input_exits_2_with_a_clear_message(plan_here, args, message):
    proc = plan_here(*args)
    assert proc.returncode == 2
    assert message in proc.stderr and "paramshard plan: error:" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize("args, message", [
    (["--servers", "2", "--param", "w=10x"], "shape '10x' is not dimensions joined by 'x'"),    # plan's own check
    (["--servers", "two", "--param", "w=10"], "invalid int value: 'two'"),                     # argparse's
])
def test_bad_input_reaches_the_user_of_the_command(args, message):
    proc = plan_cli(*args)
    assert proc.returncode == 2
    assert message in proc.stderr and "paramshard plan: error:" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
