"""What `paramshard launch --fork` saves: the start of 2 servers + 2 trainers.

The job of benchmarks/engine_startup.py (tests/e2e/scripts/sync_oracle.py --steps 1: start,
rendezvous, register, one sync step, leave, exit), launched with and without --fork,
interleaved, ``--repeats`` times each; medians of:

- ready: from starting `paramshard launch` to trainer 0's "registered ... with 2 servers" line
  (both servers serve, the chief has registered the model on them; trainer 1 says nothing
  before it ends, and takes the same path: the whole run covers it, its sync step included);
- whole: the whole run, to the launcher's exit;
- CPU: user + system seconds of the launcher and everything it started (the zygote and its
  forks included: each is reaped by its parent, so its time reaches ours).

    .venv/bin/python benchmarks/launch_fork.py [--repeats 5] [--markdown]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from tests.e2e.run_job import ORACLE, PARAMSHARD, VENV_BIN  # noqa: E402
from paramshard.launch.api import MALLOC_TUNABLES  # noqa: E402


def one_run(fork: bool, run_dir: Path) -> tuple[float, float, float]:
    """(seconds to every rank ready, seconds of the whole run, CPU seconds)."""
    argv = [PARAMSHARD, "launch", *(["--fork"] if fork else []), "--servers", "2", "--trainers", "2",
            "--run-dir", str(run_dir), ORACLE, "--steps", "1"]
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", "GLIBC_TUNABLES": MALLOC_TUNABLES}
    env.pop("PARAMSHARD_FORK", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ready, output = None, []
    for line in proc.stdout:
        output.append(line)
        if ready is None and line.startswith("trainer 0 |") and "registered" in line and "with 2 servers" in line:
            ready = time.monotonic() - started
    code = proc.wait(180)
    whole = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0 or "".join(output).count("oracle ok") != 2 or ready is None:
        raise SystemExit(f"{'--fork' if fork else 'launch'} failed (exit {code}):\n{''.join(output)[-4000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return ready, whole, cpu


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--run-dirs", default="/tmp/paramshard-launch-fork-bench")
    args = p.parse_args()
    kinds = {"launch": False, "launch --fork": True}
    times = {name: [] for name in kinds}
    loads = []
    for rep in range(args.repeats):
        for name in (list(kinds) if rep % 2 == 0 else list(reversed(kinds))):
            loads.append(os.getloadavg()[0])
            times[name].append(one_run(kinds[name], Path(args.run_dirs) / f"{name.replace(' ', '')}-{rep}"))
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
