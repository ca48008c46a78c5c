"""Conventions every `paramshard` command keeps: --version, defaults and an example in
--help, plan reading shapes from a model, PARAMSHARD_LOG_LEVEL, and the CTR demo's
shared data directory written by one process at a time."""
from __future__ import annotations

import argparse
import re
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import paramshard
from paramshard.cli.main import build_parser
from paramshard.log import level_from_environ
from paramshard.placement.sharding import ParamSpec, make_plan
from tests.e2e.in_process import cli_in_process

ROOT = Path(__file__).resolve().parents[2]
OWN_HELP = ["plan", "server", "env", "split-data", "gen-data", "export", "export-model", "predict", "run", "k8s",
            "schema", "dataset", "report", "stats"]   # launch documents itself


def cli(*args, cwd=None, env=None, timeout=60) -> subprocess.CompletedProcess:
    environ = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "paramshard", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env=environ, timeout=timeout)


def test_version():
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"paramshard {paramshard.__version__}"
    assert paramshard.__version__[0].isdigit()


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


@pytest.mark.parametrize("name", OWN_HELP)
def test_help_shows_defaults_and_an_example(name):
    parser = _subparsers()[name]
    text = parser.format_help()
    epilog = re.split(r"\nexamples?:\n", text)
    assert len(epilog) == 2 and f"paramshard {name}" in epilog[1], text
    for action in parser._actions:
        if action.option_strings and action.default not in (None, False, [], "", argparse.SUPPRESS):
            shown = parser._get_formatter()._expand_help(action)
            assert "default" in shown, (name, action.option_strings, shown)


def test_gen_data_creates_missing_directories_and_leaves_no_temporary(tmp_path, capsys, monkeypatch):
    r = cli("gen-data", "a/b/c.tsv", "--rows", 50, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "wrote 50 rows to a/b/c.tsv" in r.stdout
    assert len((tmp_path / "a/b/c.tsv").read_text().splitlines()) == 50
    assert [p.name for p in (tmp_path / "a/b").iterdir()] == ["c.tsv"]
    (tmp_path / "file").write_text("")
    monkeypatch.chdir(tmp_path)
    code, _, err = cli_in_process(capsys, "gen-data", "file/x.tsv", "--rows", 5)
    assert code == 2 and "a file is in the way" in err and "Traceback" not in err


MODEL = textwrap.dedent("""
    import torch.nn as nn
    import paramshard as ps

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = ps.SparseEmbedding("emb", 8)       # rows on the servers: no dense block
            self.fc1 = nn.Linear(784, 512)
            self.fc2 = nn.Linear(512, 10)
            self.frozen = nn.Linear(3, 3).requires_grad_(False)
""")
SCRIPT = textwrap.dedent("""
    import argparse
    import paramshard as ps
    from netmod import Net

    p = argparse.ArgumentParser()
    p.add_argument("--tag", required=True)
    args = p.parse_args()
    env = ps.init()
    print("script output", args.tag, len(env.servers))
    try:
        trainer = ps.Trainer(Net(), optimizer=ps.optim.Adam(lr=1e-3))
    except Exception:
        raise SystemExit("the plan's stand-in Trainer must not be caught as an Exception")
    raise SystemExit("the script must stop at the Trainer")
""")
NET = [ParamSpec("fc1.weight", (512, 784)), ParamSpec("fc1.bias", (512,)), ParamSpec("fc2.weight", (10, 512)),
       ParamSpec("fc2.bias", (10,))]


def test_plan_reads_shapes_from_a_model_or_a_script(tmp_path, capsys, monkeypatch):
    (tmp_path / "netmod.py").write_text(MODEL)
    (tmp_path / "train.py").write_text(SCRIPT)
    want = make_plan(NET, 3).to_json()
    # In this process (netmod, imported from the working directory, is forgotten at the end), and
    # --script, which runs a user's script with a stand-in Trainer, once as the real command.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        code, out, err = cli_in_process(capsys, "plan", "--servers", 3, "--model", "netmod:Net", "--json")
        assert code == 0, err
        assert json.loads(out) == want
        code, _, err = cli_in_process(capsys, "plan", "--servers", 3, "--model", "netmod:Nope")
        assert code == 2 and "netmod has no Nope" in err
        code, _, err = cli_in_process(capsys, "plan", "--servers", 3, "--model", "netmod:Net", "--param", "a=3")
        assert code == 2 and "not allowed with" in err
        code, _, err = cli_in_process(capsys, "plan", "--servers", 3, "--script", "train.py")   # no --tag
        assert code == 2 and "exited (2) before constructing ps.Trainer" in err
    finally:
        sys.modules.pop("netmod", None)
    r = cli("plan", "--servers", 3, "--script", "train.py", "--script-args=--tag x", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == want                  # the script's print went to stderr
    assert "script output x 3" in r.stderr


@pytest.fixture
def plan_here(capsys, monkeypatch):
    """`paramshard plan ARGS` run by this process's own ``main``, in the environment cli() gives it."""
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("NO_COLOR", "1")

    def run(*args) -> subprocess.CompletedProcess:
        code, out, err = cli_in_process(capsys, "plan", *args)
        return subprocess.CompletedProcess(["paramshard", "plan", *args], code, out, err)
    return run


def test_plan_suggests_balanced_when_load_is_uneven(plan_here):
    cli = lambda command, *args: plan_here(*args)      # noqa: E731  (every call below is `plan`)
    uneven = ["--servers", 2, "--param", "a=5000", "--param", "b=5000", "--param", "c=10000"]
    assert make_plan([ParamSpec("a", (5000,)), ParamSpec("b", (5000,)), ParamSpec("c", (10000,))],
                     2).load_ratio() == 1.5
    r = cli("plan", *uneven)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip().splitlines()[-1] == \
        "note: load max/mean 1.500 is above 1.2: try --dispatch balanced (load max/mean 1.000)"
    r = cli("plan", *uneven, "--json")
    json.loads(r.stdout)                                   # still one JSON document
    assert "--dispatch balanced" in r.stderr
    r = cli("plan", *uneven, "--dispatch", "balanced")
    assert "note:" not in r.stdout
    r = cli("plan", "--servers", 2, "--param", "fc.w=1000x10", "--param", "fc.b=10", "--min-block-size", 1000)
    assert "load max/mean: 1.001" in r.stdout and "note:" not in r.stdout
    r = cli("plan", "--servers", 2, "--param", "fc.w=1000x10")          # one block: nothing to place
    assert "try a smaller --min-block-size" in r.stdout


LEVEL_PROBE = ("import logging, paramshard.log as l; l.configure('probe'); "
               "print(logging.getLevelName(logging.getLogger('paramshard').level))")


LEVELS = [(None, "INFO"), ("debug", "DEBUG"), ("WARNING", "WARNING"), ("ERROR", "ERROR"), ("loud", "INFO")]


@pytest.mark.parametrize("value, level", LEVELS)
def test_log_level_from_the_variable(value, level):
    level_got, problem = level_from_environ({} if value is None else {"PARAMSHARD_LOG_LEVEL": value})
    assert level_got == level
    if value == "loud":
        assert "PARAMSHARD_LOG_LEVEL='loud' is not a log level" in problem
    else:
        assert problem is None


@pytest.mark.parametrize("value, level", [LEVELS[1], LEVELS[4]])
def test_log_level_variable(value, level):
    """A process configured by the variable (a level, and a bad value warned about on stderr)."""
    environ = {k: v for k, v in os.environ.items() if k != "PARAMSHARD_LOG_LEVEL"}
    if value is not None:
        environ["PARAMSHARD_LOG_LEVEL"] = value
    r = subprocess.run([sys.executable, "-c", LEVEL_PROBE], capture_output=True, text=True, env=environ,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == level
    if value == "loud":
        assert "PARAMSHARD_LOG_LEVEL='loud' is not a log level" in r.stderr
    else:
        assert r.stderr == ""


def test_env_lists_the_log_level_variable(capsys):
    code, out, _ = cli_in_process(capsys, "env")
    assert code == 0 and "| `PARAMSHARD_LOG_LEVEL` |" in out


PREPARE = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from pathlib import Path
    from ctr_wide_deep import prepare_synthetic
    shards, test, ceiling = prepare_synthetic(Path(sys.argv[2]), 3000, 500, 2, int(sys.argv[3]), timeout=60)
    print(sorted(p.name for p in shards.iterdir()), len(test.read_text().splitlines()), ceiling)
""")


def test_ctr_demo_runs_sharing_a_workdir_do_not_race(tmp_path):
    """Two runs' chiefs and a second trainer at once; plus a directory an interrupted
    (older) run left half-written, which must be replaced, not trusted."""
    stale = tmp_path / "synthetic-3000-500-2shards"
    stale.mkdir()
    (stale / "all.tsv").write_text("half")
    procs = [subprocess.Popen([sys.executable, "-c", PREPARE, str(ROOT / "examples"), str(tmp_path), str(tid)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for tid in (1, 0, 0)]
    outs = [p.communicate(timeout=90) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert len({o[0] for o in outs}) == 1, outs          # every process saw the same, complete data
    assert outs[0][0].startswith("['part-00000', 'part-00001'] 500 0.")
    assert sorted(p.name for p in stale.iterdir()) == ["READY", "shards", "test.tsv", "train.tsv"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".synthetic-3000-500-2shards.lock",
                                                          "synthetic-3000-500-2shards"]
