"""The fork server (`paramshard launch --fork`, launch/engines/fork_server.py and launch/engines/zygote.py):
a forked rank starts, runs and ends as the same command started as a new process would,
and none outlives the launcher. One zygote (with the real imports) serves the module."""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from paramshard.errors import ConfigError
from paramshard.launch.engines import fork_server
from paramshard.launch.engines.processes import Child
from paramshard.launch.supervision.rank_exit import RankExit
from tests.integration.fork_ranks import gone, rank_script as script

# Starts a zygote and kills its ranks: `make test` only, not `make check`.
pytestmark = pytest.mark.processes

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
ENV.pop("PARAMSHARD_FORK", None)


@pytest.fixture(scope="module")
def server():
    s = fork_server.ForkServer(fork_server.zygote_environ(ENV)).start()
    yield s
    s.close()


def test_the_zygote_imported_everything_and_started_no_thread(server, tmp_path):
    # A fork copies only the forking thread: any other would leave its locks held in the rank.
    assert server.problem is None
    path = script(tmp_path, """
        import sys
        print(sorted(m for m in ("torch", "pandas", "numba", "zmq", "paramshard.server.core.parameter_server")
                     if m in sys.modules))
    """)
    proc = server.fork([sys.executable, path], ENV)
    assert proc.wait(30) == 0
    assert proc.stdout.read().strip() == str(sorted(["torch", "pandas", "numba", "zmq",
                                                     "paramshard.server.core.parameter_server"]))
    missing = server.fork([sys.executable, "-m", "no_such_module_here"], ENV)
    assert missing.wait(30) == 1                   # `python -m missing` fails with 1 and says why
    assert "No module named no_such_module_here" in missing.stdout.read()


def test_argv_environment_cwd_output_and_session_are_the_ranks(server, tmp_path):
    path = script(tmp_path, """
        import json, os, sys
        proc_environ = [v.decode() for v in open("/proc/self/environ", "rb").read().split(b"\\0") if v]
        print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "x": os.environ.get("PSTEST_X"),
                          "y": os.environ.get("PSTEST_ZYGOTE_ONLY"), "name": __name__, "path0": sys.path[0],
                          "sid": os.getsid(0), "pgid": os.getpgid(0), "pid": os.getpid(),
                          "stdin": sys.stdin.read(), "threads": __import__("torch").get_num_threads(),
                          "sigint": repr(__import__("signal").getsignal(2)),
                          "proc_environ": proc_environ}))
        print("to stderr", file=sys.stderr)
    """)
    env = dict(ENV, PSTEST_X="forty-two", OMP_NUM_THREADS="2")
    proc = server.fork([sys.executable, path, "a", "b c"], env, cwd=str(tmp_path.parent))
    assert proc.wait(30) == 0
    lines = proc.stdout.read().splitlines()
    seen = json.loads(lines[0])
    assert seen["argv"] == [path, "a", "b c"] and seen["cwd"] == str(tmp_path.parent)
    assert seen["x"] == "forty-two" and seen["y"] is None and seen["name"] == "__main__"
    assert seen["path0"] == str(tmp_path)
    assert seen["sid"] == seen["pgid"] == seen["pid"] == proc.pid     # a session and group of its own
    assert seen["stdin"] == "" and seen["threads"] == 2              # stdin /dev/null; its own thread count
    assert "default_int_handler" in seen["sigint"]                    # Ctrl-C raises, as in a new python
    assert lines[1] == "to stderr"                                    # stderr merged into the same pipe
    # What ps, tools and tests read of a process's environment is the rank's, not the zygote's.
    shown = seen["proc_environ"]
    assert shown.count("PSTEST_X=forty-two") == 1 and not any(v.startswith("PSFORK_ENV_ROOM=") for v in shown)


def test_a_module_runs_as_python_m(server, tmp_path):
    script(tmp_path, "import sys\nprint(__name__, sys.argv[0].endswith('fsmod.py'), sys.argv[1:])\n", "fsmod.py")
    proc = server.fork([sys.executable, "-m", "fsmod", "--flag", "1"], ENV, cwd=str(tmp_path))
    assert proc.wait(30) == 0
    assert proc.stdout.read().strip() == "__main__ True ['--flag', '1']"


@pytest.mark.parametrize("body, code", [("raise SystemExit(3)", 3), ("import sys; sys.exit('bad')", 1),
                                        ("raise RuntimeError('boom')", 1), ("raise KeyboardInterrupt", -2),
                                        ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -15)])
def test_exit_codes_are_a_new_interpreters(server, tmp_path, body, code):
    path = script(tmp_path, body + "\n")
    forked = server.fork([sys.executable, path], ENV)
    plain = subprocess.run([sys.executable, path], env=ENV, capture_output=True, text=True, timeout=60)
    assert forked.wait(30) == plain.returncode == code
    out = forked.stdout.read()
    if "RuntimeError" in body:
        assert out.splitlines()[-1] == "RuntimeError: boom" == plain.stderr.splitlines()[-1]
        assert "zygote.py" not in out                     # the traceback is the rank's own
    if "bad" in body:
        assert out.strip() == "bad"


def test_non_daemon_threads_and_atexit_run_before_the_exit(server, tmp_path):
    path = script(tmp_path, """
        import atexit, threading, time
        atexit.register(lambda: print("atexit ran"))
        threading.Thread(target=lambda: (time.sleep(0.3), print("thread done"))).start()
    """)
    proc = server.fork([sys.executable, path], ENV)
    assert proc.wait(30) == 0
    assert proc.stdout.read().splitlines() == ["thread done", "atexit ran"]


@pytest.mark.parametrize("body", ["raise RuntimeError('boom')", "raise KeyboardInterrupt", "raise SystemExit(3)"])
def test_the_atexit_handlers_see_the_uncaught_exception_as_a_new_interpreters_do(server, tmp_path, body):
    """An uncaught exception is in sys.last_value when the atexit handlers run (the interpreter
    puts it there): a Trainer the script did not close tells the servers of a death, not a
    leave, by it (torch/open_trainers.py). Forked ranks did not set it: the servers took a
    crashed trainer for one that left, and a sync job went on without it (tests/e2e/test_root_cause.py)."""
    path = script(tmp_path, "import atexit, sys\n"
                            "atexit.register(lambda: print('at exit:', type(getattr(sys, 'last_value', None)).__name__, "
                            "flush=True))\n" + body + "\n")
    forked = server.fork([sys.executable, path], ENV)
    plain = subprocess.run([sys.executable, path], env=ENV, capture_output=True, text=True, timeout=60)
    forked.wait(30)
    seen = [line for line in forked.stdout.read().splitlines() if line.startswith("at exit:")]
    assert seen == [line for line in plain.stdout.splitlines() if line.startswith("at exit:")], plain.stdout
    assert seen == ["at exit: NoneType" if "SystemExit" in body else f"at exit: {body.split()[1].split('(')[0]}"]


def test_a_killed_rank_ends_for_the_launcher_as_an_unforked_one_does(server, tmp_path):
    """What the supervision loop reads of a rank killed from outside (poll, describe_exit, the
    status the restart policy and the summary use) is the same forked or not."""
    path = script(tmp_path, "import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    env = dict(ENV)
    forked = Child("trainer 1", [sys.executable, path], env, out=open(os.devnull, "w"),
                   spawn=lambda: server.fork([sys.executable, path], env))
    plain = Child("trainer 1", [sys.executable, path], env, out=open(os.devnull, "w"))
    for child in (forked, plain):
        deadline = time.monotonic() + 60
        while not child.recent_lines() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert child.poll() is None
        os.kill(child.pid, signal.SIGKILL)           # from outside, as the tests that kill ranks do
        deadline = time.monotonic() + 10
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
    assert forked.poll() == plain.poll() == -signal.SIGKILL
    assert (forked.describe_exit().replace(str(forked.pid), "PID")
            == plain.describe_exit().replace(str(plain.pid), "PID")
            == "trainer 1 (pid PID) was killed by SIGKILL")
    assert RankExit.of(forked).status == RankExit.of(plain).status == 128 + signal.SIGKILL
    forked.stop(grace=1)                              # already gone: a no-op on a pid the zygote reaped
    plain.stop(grace=1)


def test_stop_terminates_the_whole_group(server, tmp_path):
    path = script(tmp_path, """
        import subprocess, sys, time
        kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(kid.pid, flush=True)
        time.sleep(60)
    """)
    child = Child("server 0", [sys.executable, path], ENV, out=open(os.devnull, "w"),
                  spawn=lambda: server.fork([sys.executable, path], ENV))
    deadline = time.monotonic() + 60
    while not child.recent_lines() and time.monotonic() < deadline:
        time.sleep(0.02)
    grandchild = int(child.recent_lines()[0][1])
    child.stop(grace=5)
    assert child.poll() == -signal.SIGTERM
    assert gone(grandchild)


def test_what_cannot_be_forked_starts_as_a_new_process(server):
    assert server.reason_not_to_fork([sys.executable, "x.py"], ENV) is None
    assert server.reason_not_to_fork([sys.executable, "-m", "paramshard", "server"], ENV) is None
    assert "is not" in server.reason_not_to_fork(["/bin/echo", "x"], ENV)
    assert "is not" in server.reason_not_to_fork([sys.executable, "-c", "pass"], ENV)
    why = server.reason_not_to_fork([sys.executable, "x.py"], dict(ENV, PYTHONPATH="/elsewhere"))
    assert "PYTHONPATH differs" in why
    # Read after start-up (torch.set_num_threads in the rank): no reason not to fork.
    assert server.reason_not_to_fork([sys.executable, "x.py"], dict(ENV, OMP_NUM_THREADS="7")) is None


def test_no_rank_outlives_the_zygote(tmp_path):
    """The launcher's end closes (it exited): the zygote kills its ranks; the zygote is killed
    outright: each rank's parent-death signal kills it. (A zygote that imports little: what
    is tested here does not depend on what it imported.)"""
    path = script(tmp_path, "import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    for how in ("close", "kill"):
        s = fork_server.ForkServer(fork_server.zygote_environ(ENV), preload=["json"]).start()
        procs = [s.fork([sys.executable, path], ENV) for _ in range(2)]
        for p in procs:
            assert p.stdout.readline() == "up\n"
        if how == "close":
            s.close()
        else:
            os.kill(s.pid, signal.SIGKILL)
            s._proc.wait(10)
        assert all(gone(p.pid) for p in procs), how
        for p in procs:
            assert p.wait(10) == -signal.SIGKILL          # the launcher hears of it, whichever way
        s.close()


def test_fork_is_refused_over_ssh_and_the_variable_ignored(monkeypatch):
    from paramshard.cli.jobs.launch import _fork
    monkeypatch.delenv("PARAMSHARD_FORK", raising=False)
    with pytest.raises(ConfigError, match="--fork forks ranks on this machine; with --hosts"):
        _fork(argparse.Namespace(hosts="10.0.0.1", fork=True))
    monkeypatch.setenv("PARAMSHARD_FORK", "1")
    assert _fork(argparse.Namespace(hosts="10.0.0.1", fork=False)) is False
    assert _fork(argparse.Namespace(hosts=None, fork=False)) is True
    monkeypatch.setenv("PARAMSHARD_FORK", "maybe")
    with pytest.raises(ConfigError, match="PARAMSHARD_FORK='maybe': expected 1"):
        _fork(argparse.Namespace(hosts=None, fork=False))
