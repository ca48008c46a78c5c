"""Signals to `paramshard launch`: every process of the job goes with the launcher.

SIGINT (Ctrl-C), SIGTERM (timeout, Slurm, Kubernetes, systemd) and SIGHUP
(closed terminal) are handled: the launcher stops the job and exits with
128+signal. SIGKILL cannot be handled; the children must still go, through
their parent-death signal and the launcher's guardian process.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from paramshard.launch.engines import processes

SERVERS, TRAINERS = 2, 2
# Every rank a new process (the suite forks them by default, tests/conftest.py): this module
# checks the plain path's process tree and signals, and its trainers import no torch, so a
# forked one would only wait for the zygote's imports.
SPAWNED = {"PARAMSHARD_FORK": "0"}

# A real trainer (it takes its role from the environment contract) that, like
# a script with DataLoader workers, has a child of its own, then idles.
TRAINER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    import paramshard as ps
    ps.init()
    if os.environ.get("IGNORE_SIGTERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    tmp = os.path.join(sys.argv[1], f".{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()} {worker.pid}")
    os.replace(tmp, os.path.join(sys.argv[1], str(os.getpid())))
    time.sleep(120)
""")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) of a process, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return fields[0], int(fields[19])


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def _alive(pid: int, started: int | None = None) -> bool:
    # A zombie is dead: where PID 1 does not reap orphans they stay zombies.
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X") and (started is None or st[1] == started)


def _descendants(pid: int) -> dict[int, int]:
    """Every process below ``pid`` (children, grandchildren, ...) -> its start time."""
    found, todo = {}, [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except FileNotFoundError:
                continue
            for kid in kids:
                st = _stat(kid)
                if st is not None and kid not in found:
                    found[kid] = st[1]
                    todo.append(kid)
    return found


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _start_job(tmp_path, **env):
    """Launch S servers and T trainers in a session of their own; return (launcher, output file)."""
    script, pid_dir, out = tmp_path / "idle.py", tmp_path / "pids", tmp_path / "launcher.log"
    script.write_text(TRAINER)
    pid_dir.mkdir()
    with open(out, "w") as log:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "paramshard", "launch", "--servers", str(SERVERS), "--trainers", str(TRAINERS),
             "--timeout", "10", str(script), str(pid_dir)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, **SPAWNED, **env})
    return launcher, out


def _wait_running(launcher, tmp_path, out) -> dict[int, int]:
    """Once every trainer runs the script and has started its own child: the launcher's process tree."""
    pid_dir = tmp_path / "pids"

    def written() -> list:
        # Only the renamed files: a ".PID" file is a trainer's half-written temp
        # file that may be renamed between listing and reading it.
        return [f for f in pid_dir.iterdir() if not f.name.startswith(".")]

    _wait_for(lambda: len(written()) >= TRAINERS or launcher.poll() is not None, 30,
              "the trainers to start")
    assert launcher.poll() is None, out.read_text()
    workers = [int(p) for f in written() for p in f.read_text().split()]
    tree = _descendants(launcher.pid)
    assert set(workers) <= set(tree), (workers, tree)
    assert len(tree) >= SERVERS + 2 * TRAINERS, tree      # servers, trainers, the trainers' children
    assert all(_alive(p, t) for p, t in tree.items()), out.read_text()
    return tree


def _wait_all_gone(tree: dict[int, int], timeout: float, after: str) -> None:
    def alive():
        return [p for p, t in tree.items() if _alive(p, t)]
    deadline = time.monotonic() + timeout
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(), f"still running {timeout} s after {after}: {alive()}"


def _cleanup(launcher, tree: dict[int, int]) -> None:
    if launcher.poll() is None:
        launcher.kill()
        launcher.wait(10)
    for pid, started in tree.items():
        if _alive(pid, started):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL],
                         ids=lambda s: s.name)
def test_signal_to_launcher_takes_every_process_of_the_job_with_it(tmp_path, sig):
    launcher, out = _start_job(tmp_path)
    tree: dict[int, int] = {}
    try:
        tree = _wait_running(launcher, tmp_path, out)
        launcher.send_signal(sig)
        code = launcher.wait(20)
        if sig != signal.SIGKILL:
            log = out.read_text()
            assert code == 128 + sig, log
            assert f"{sig.name} received" in log, log
        _wait_all_gone(tree, 15, sig.name)
    finally:
        _cleanup(launcher, tree)


def test_a_second_signal_kills_at_once_what_ignores_the_first(tmp_path):
    launcher, out = _start_job(tmp_path, IGNORE_SIGTERM="1")      # trainers ignore SIGTERM
    tree: dict[int, int] = {}
    try:
        tree = _wait_running(launcher, tmp_path, out)
        start = time.monotonic()
        launcher.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        launcher.send_signal(signal.SIGINT)
        code = launcher.wait(20)
        assert code == 128 + signal.SIGTERM, out.read_text()
        assert time.monotonic() - start < 4, "the launcher waited out its grace period"   # 5 s
        assert "SIGINT again" in out.read_text()
        _wait_all_gone(tree, 5, "the launcher exited")
    finally:
        _cleanup(launcher, tree)


def test_parent_death_signal_kills_a_child_whose_parent_is_sigkilled(tmp_path):
    """The guard alone (no launcher, no guardian): the kernel kills the child with its parent."""
    parent = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import subprocess, sys, time
            from paramshard.launch.engines.processes import guarded_argv
            child = subprocess.Popen(guarded_argv([sys.executable, "-c", "import time; time.sleep(60)"]))
            print(child.pid, flush=True)
            time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = None
    try:
        child = int(parent.stdout.readline())
        # Past the guard (prctl done, exec'd), so this is the kernel's doing, not the orphan check.
        _wait_for(lambda: b"time.sleep(60)" in _cmdline(child) and b"guard" not in _cmdline(child), 10,
                  "the guarded child to exec")
        started = _stat(child)[1]
        parent.kill()
        parent.wait(10)
        _wait_all_gone({child: started}, 5, "its parent was SIGKILLed")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        parent.stdout.close()
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)


def test_stopping_many_children_takes_one_grace_period_not_one_each(tmp_path):
    # Each child says (with a file) when it ignores SIGTERM: a child SIGTERMed before that dies of
    # it, where the test wants it to wait out the grace period and be SIGKILLed.
    stubborn = [sys.executable, "-c",
                "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "open(sys.argv[1], 'w').close(); time.sleep(60)"]
    devnull = open(os.devnull, "w")
    children = [processes.Child(f"stubborn {i}", [*stubborn, str(tmp_path / f"up-{i}")], dict(os.environ), out=devnull)
                for i in range(4)]
    try:
        _wait_for(lambda: all((tmp_path / f"up-{i}").exists() for i in range(4)), 60,
                  "the children to ignore SIGTERM")
        start = time.monotonic()
        processes.stop_all(children, grace=2.0)
        elapsed = time.monotonic() - start
        assert all(c.poll() == -signal.SIGKILL for c in children), [c.poll() for c in children]
        assert elapsed < 6.0, f"stopping 4 children with a 2 s grace took {elapsed:.1f} s (one grace each: 8 s)"
    finally:
        for c in children:
            if c.poll() is None:
                c.proc.kill()
                c.proc.wait(5)
        devnull.close()


def test_child_whose_launcher_is_already_gone_does_not_run(tmp_path):
    """The race PR_SET_PDEATHSIG cannot cover: the parent died before prctl ran."""
    marker = tmp_path / "ran"
    argv = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    # Pretend the launcher had another pid: the child must see it is orphaned and not exec.
    r = subprocess.run(processes.guarded_argv(argv, parent_pid=os.getpid() + 100000), timeout=30,
                       capture_output=True, text=True)
    assert r.returncode != 0 and not marker.exists(), r.stderr
    r = subprocess.run(processes.guarded_argv(argv, parent_pid=os.getpid()), timeout=30)
    assert r.returncode == 0 and marker.exists()
