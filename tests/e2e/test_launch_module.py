"""`paramshard launch -m MODULE`, and the thread count the launcher gives each process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from paramshard.errors import ConfigError
from paramshard.launch.api import LaunchConfig, thread_environ, usable_cpus
from paramshard.launch.rank.target import split_attached_module
from paramshard.cli.jobs.launch import add_arguments
from tests.e2e.in_process import cli_in_process

MODULE = textwrap.dedent("""
    import json, os, sys
    import torch, torch.nn as nn
    import paramshard as ps
    env = ps.init()
    model = nn.Linear(4, 2)
    trainer = ps.Trainer(model, ps.optim.SGD(lr=0.1))
    trainer.step(model(torch.ones(2, 4)).pow(2).mean())
    trainer.close()
    out = os.environ["PSTEST_OUT"]
    with open(os.path.join(out, f"trainer-{env.trainer_id}.json"), "w") as f:
        json.dump({"argv": sys.argv[1:], "name": __name__, "spec": __spec__.name,
                   "trainers": env.num_trainers}, f)
""")

THREADS = textwrap.dedent("""
    import os, torch
    import paramshard as ps
    ps.init()
    print("threads", os.environ["OMP_NUM_THREADS"], os.environ.get("MKL_NUM_THREADS"), torch.get_num_threads())
    ps.Trainer(torch.nn.Linear(2, 1), ps.optim.SGD(lr=0.1)).close()     # the server sees it leave
""")


def launch(*args, env_extra: dict | None = None, cwd=None, timeout: float = 60) -> tuple[int, str]:
    """Run `paramshard launch ARGS` in a process group of its own, killed at the deadline;
    the thread variables of this test's own environment are left out."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") and not k.startswith(("PARAMSHARD_", "PADDLE_"))}
    env.update(env_extra or {})
    proc = subprocess.Popen([sys.executable, "-m", "paramshard", "launch", *map(str, args)], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=10)
        pytest.fail(f"paramshard launch {' '.join(map(str, args))} still ran after {timeout} s:\n{output[-4000:]}")
    return proc.returncode, output


@pytest.fixture
def package(tmp_path):
    """A package on PYTHONPATH only (not in the launcher's working directory)."""
    root = tmp_path / "src"
    (root / "psmod_pkg").mkdir(parents=True)
    (root / "psmod_pkg" / "__init__.py").write_text("")
    (root / "psmod_pkg" / "train.py").write_text(MODULE)
    (root / "psmod_pkg" / "threads.py").write_text(THREADS)
    out = tmp_path / "out"
    out.mkdir()
    return {"PYTHONPATH": str(root), "PSTEST_OUT": str(out)}


def test_module_runs_as_every_trainer_with_its_own_arguments(tmp_path, package):
    # Option-like words after the module, -m and --servers included, are the module's.
    # --train is no abbreviation of --trainers here: every word after the module is its own.
    code, output = launch("--servers", 2, "--trainers", 2, "-m", "psmod_pkg.train", "--train", "a.csv",
                          "-m", "x", "--servers", "9", env_extra=package, cwd=tmp_path)
    assert code == 0, output
    for t in (0, 1):
        ran = json.loads((tmp_path / "out" / f"trainer-{t}.json").read_text())
        assert ran == {"argv": ["--train", "a.csv", "-m", "x", "--servers", "9"], "name": "__main__",
                       "spec": "psmod_pkg.train", "trainers": 2}


def test_attached_module_flag_is_split_only_among_the_launchers_flags():
    split = lambda *argv: split_attached_module(list(argv), add_arguments)
    assert split("--servers", "2", "-mpkg.train", "--epochs", "3") == ["--servers", "2", "-m", "pkg.train",
                                                                       "--epochs", "3"]
    assert split("--module=pkg.train", "x") == ["-m", "pkg.train", "x"]
    assert split("--resume", "-mpkg") == ["--resume", "-m", "pkg"]          # --resume's value is optional
    assert split("--hosts", "h1", "train.py", "-mfoo") == ["--hosts", "h1", "train.py", "-mfoo"]   # the script's


@pytest.mark.parametrize("args,message", [
    ([], "nothing to run: give a training script (SCRIPT [ARGS]) or a module (-m MODULE [ARGS])"),
    (["--servers", "2"], "nothing to run"),
    (["-m"], "-m needs a module name"),
    (["--module="], "not a module name"),
    (["-m", "pkg/train"], "-m 'pkg/train': not a module name (dotted Python names, e.g. mypkg.train); "
                          "to run a file, give its path without -m"),
    (["-m", "train.py"], "-m 'train.py': not a module name"),    # train.py exists here
    (["-m", "pkg.train", "--", "train.py"], "both a script ('train.py') and -m pkg.train: give one of them"),
])
def test_neither_or_both_or_a_bad_module_name_is_a_clear_error(tmp_path, capsys, monkeypatch, args, message):
    (tmp_path / "train.py").write_text("raise SystemExit('must not run')\n")
    monkeypatch.chdir(tmp_path)
    code, out, err = cli_in_process(capsys, "launch", *args)
    output = out + err
    assert code == 2, output
    assert "paramshard launch: error: " in output and message in output
    assert "Traceback" not in output and "started" not in output


def test_launch_config_takes_a_script_or_a_module():
    with pytest.raises(ConfigError, match="both a script"):
        LaunchConfig(script=__file__, module="pkg.train")
    with pytest.raises(ConfigError, match="nothing to run"):
        LaunchConfig()
    assert LaunchConfig(module="pkg.train", script_args=("-x",)).module == "pkg.train"   # not looked for here


def test_missing_module_fails_the_job_naming_the_trainer(tmp_path):
    start = time.monotonic()
    code, output = launch("--servers", 1, "--trainers", 2, "-m", "psmod_no_such.train", "--epochs", "1",
                          cwd=tmp_path, timeout=90)
    assert code == 1, output
    assert "No module named 'psmod_no_such'" in output
    assert "first failure: trainer " in output and "exit code 1" in output
    # Had the launcher not stopped the job, the server would wait its 120 s timeout for the trainers:
    # 60 s tells the two apart with a busy machine's start of the 3 processes in it.
    assert time.monotonic() - start < 60, output


def test_thread_share_of_the_host():
    assert thread_environ(8, 3, {}) == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    assert thread_environ(2, 5, {}) == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    assert thread_environ(8, 2, {"MKL_NUM_THREADS": "3"}) == {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "3"}
    # The user's choice is passed on as it is.
    assert thread_environ(8, 2, {"OMP_NUM_THREADS": "6"}) == {"OMP_NUM_THREADS": "6"}


SHARE = max(1, usable_cpus() // 2)


@pytest.mark.parametrize("preset,expected", [(None, SHARE), ("1", 1), (str(SHARE + 1), SHARE + 1)])
def test_each_process_gets_its_share_of_the_cores_unless_set(tmp_path, package, preset, expected):
    env = dict(package, **({"OMP_NUM_THREADS": preset} if preset else {}))
    code, output = launch("--servers", 1, "--trainers", 1, "-m", "psmod_pkg.threads", env_extra=env, cwd=tmp_path)
    assert code == 0, output
    mkl = str(expected) if preset is None else "None"      # a preset OMP_NUM_THREADS alone: MKL follows it
    assert f"trainer 0 | threads {expected} {mkl} {expected}" in output


def test_script_and_module_words_are_never_read_as_abbreviated_flags():
    from paramshard.cli.main import build_parser
    parse = build_parser().parse_args
    assert parse(["launch", "t.py", "--train", "a.csv"]).script_args == ["--train", "a.csv"]
    assert parse(["run", "--servers", "1", "-m", "pkg", "--serv", "x"]).module == ["pkg", "--serv", "x"]


def test_run_and_k8s_take_a_module_too():
    from paramshard.launch.engines.k8s import K8sJobSpec, job_doc
    spec = K8sJobSpec(script=None, module="pkg.train", script_args=("--epochs", "3"), image="img", servers=2,
                      trainers=3, existing_secret=True)
    assert job_doc(spec)["spec"]["template"]["spec"]["containers"][0]["args"] == [
        "run", "--servers", "2", "-m", "pkg.train", "--epochs", "3"]


def test_ssh_hosts_of_one_machine_share_its_cpus():
    from paramshard.launch.engines.hosts import parse_hosts
    from paramshard.launch.engines.ssh import Probed, SshHosts, SshOptions, threads_by_host
    hosts = parse_hosts("127.0.0.2,127.0.0.3,10.0.0.9")
    placement = SshHosts(LaunchConfig(module="pkg.train", servers=2, trainers=4, check_script=False), hosts,
                         SshOptions())
    found = {"127.0.0.2": Probed("m1", 8, []), "127.0.0.3": Probed("m1", 8, []), "10.0.0.9": Probed("m2", 12, [])}
    threads = threads_by_host([*placement.on_servers, *placement.on_trainers], found)
    # 2 ranks on each host: 4 on machine m1 (8 CPUs), 2 on m2 (12 CPUs).
    assert {h: t["OMP_NUM_THREADS"] for h, t in threads.items()} == {"127.0.0.2": "2", "127.0.0.3": "2",
                                                                     "10.0.0.9": "6"}
