"""What `paramshard launch --fork` saves: the start of 2 servers + 2 trainers.

The job of benchmarks/engine_startup.py (tests/e2e/scripts/sync_oracle.py --steps 1: start,
rendezvous, register, one sync step, leave, exit), launched without --fork, with it (a zygote of
the launcher's own), and with it from a shared fork server (PARAMSHARD_FORK_SERVER: one host
started before the runs, as the test suite has one; launch/engines/zygote_host.py), interleaved,
``--repeats`` times each; medians of:

- ready: from starting `paramshard launch` to trainer 0's "registered ... with 2 servers" line
  (both servers serve, the chief has registered the model on them; trainer 1 says nothing
  before it ends, and takes the same path: the whole run covers it, its sync step included);
- whole: the whole run, to the launcher's exit;
- CPU: user + system seconds of the launcher and everything it started (the zygote and its
  forks included: each is reaped by its parent, so its time reaches ours; with the shared
  server, the host's children's time, read from /proc once it reaped the job's zygote).

    .venv/bin/python benchmarks/launch_fork.py [--repeats 5] [--markdown]
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from tests.e2e.run_job import ORACLE, PARAMSHARD, VENV_BIN  # noqa: E402
from paramshard.launch.api import MALLOC_TUNABLES  # noqa: E402
from paramshard.launch.engines import zygote_host  # noqa: E402


def host_cpu(pid: int) -> float:
    """User + system seconds of process ``pid`` and of the children it reaped (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def host_children(pid: int) -> list[str]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return f.read().split()


def one_run(kind: str, run_dir: Path, host: tuple | None) -> tuple[float, float, float]:
    """(seconds to every rank ready, seconds of the whole run, CPU seconds)."""
    fork = kind != "launch"
    argv = [PARAMSHARD, "launch", *(["--fork"] if fork else []), "--servers", "2", "--trainers", "2",
            "--run-dir", str(run_dir), ORACLE, "--steps", "1"]
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", "GLIBC_TUNABLES": MALLOC_TUNABLES}
    env.pop("PARAMSHARD_FORK", None)
    env.pop("PARAMSHARD_FORK_SERVER", None)
    shared = host is not None and kind == SHARED
    if shared:
        env["PARAMSHARD_FORK_SERVER"] = host[1]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    host_before = host_cpu(host[0].pid) if shared else 0.0
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ready, output = None, []
    assert proc.stdout is not None
    for line in proc.stdout:
        output.append(line)
        if ready is None and line.startswith("trainer 0 |") and "registered" in line and "with 2 servers" in line:
            ready = time.monotonic() - started
    code = proc.wait(180)
    whole = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0 or "".join(output).count("oracle ok") != 2 or ready is None:
        raise SystemExit(f"{kind} failed (exit {code}):\n{''.join(output)[-4000:]}")
    if fork and "starts as a new process" in "".join(output):
        raise SystemExit(f"{kind}: a rank was not forked:\n{''.join(output)[-4000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if shared:
        deadline = time.monotonic() + 10
        while host_children(host[0].pid) and time.monotonic() < deadline:
            time.sleep(0.05)            # the host reaps the job's zygote (and so its ranks' time) within 1 s
        cpu += host_cpu(host[0].pid) - host_before
    return ready, whole, cpu


SHARED = "launch --fork, shared fork server"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--run-dirs", default="/tmp/paramshard-launch-fork-bench")
    args = p.parse_args()
    kinds = ["launch", "launch --fork", SHARED]
    times: dict[str, list] = {name: [] for name in kinds}
    loads = []
    room = tempfile.mkdtemp(prefix="paramshard-bench-fork-host-")
    host = (zygote_host.start(os.path.join(room, "zygote.sock")), os.path.join(room, "zygote.sock"))
    try:
        for rep in range(args.repeats):
            for name in (kinds if rep % 2 == 0 else list(reversed(kinds))):
                loads.append(os.getloadavg()[0])
                times[name].append(one_run(name, Path(args.run_dirs) / f"{name.replace(' ', '')[:16]}-{rep}", host))
    finally:
        os.killpg(host[0].pid, signal.SIGKILL)
        host[0].wait(10)
        shutil.rmtree(room, ignore_errors=True)
    rows = []
    for name, runs in times.items():
        ready, whole, cpu = (statistics.median(r[i] for r in runs) for i in range(3))
        rows.append((name, f"{ready:.2f}", f"{whole:.2f}", f"{cpu:.1f}",
                     f"{min(r[1] for r in runs):.2f}-{max(r[1] for r in runs):.2f}"))
    C.emit(args.markdown, [("2 servers + 2 trainers, sync_oracle.py --steps 1",
                            ["launch", "ready s (median)", "whole run s (median)", "CPU s (median)",
                             "whole run min-max s"], rows, [False, True, True, True, True])],
           [f"{args.repeats} interleaved runs each, {os.cpu_count()} CPUs; load average (1 min) at the runs' "
            f"starts {min(loads):.1f}-{max(loads):.1f} (other jobs shared the machine)."])


if __name__ == "__main__":
    main()
