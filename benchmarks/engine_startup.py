"""How long a job takes to get going under each engine: 2 servers + 2 trainers.

Each engine runs the same script (tests/e2e/scripts/sync_oracle.py) with
``--steps 1``: start, rendezvous, register, one sync step, leave, exit. The
wall time of that whole job is the start-up cost a user pays; the engines are
interleaved, ``--repeats`` times each, and the median is reported.

- launch:   paramshard launch --servers 2 --trainers 2
- mpirun:   mpirun -np 4 paramshard run --servers 2   (OpenMPI, as root)
- torchrun: torchrun --standalone --nproc-per-node 4 --no-python paramshard run --servers 2
- srun:     srun -n 4 paramshard run --servers 2      (a throwaway Slurm cluster,
            started once before timing: tests/engines/slurm.py)

    .venv/bin/python benchmarks/engine_startup.py [--repeats 5] [--markdown]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from tests.e2e.run_job import ORACLE, PARAMSHARD, VENV_BIN, run_job  # noqa: E402


def commands(slurm):
    from tests.engines.mpi import mpirun_argv
    job = ["--servers", "2", ORACLE, "--steps", "1"]
    out = {
        "launch": ([PARAMSHARD, "launch", "--servers", "2", "--trainers", "2", ORACLE, "--steps", "1"], None),
        "mpirun": (mpirun_argv(4, PARAMSHARD, "run", *job), None),
        "torchrun": ([str(VENV_BIN / "torchrun"), "--standalone", "--nproc-per-node", "4", "--no-python",
                      PARAMSHARD, "run", *job], None),
    }
    if slurm is not None:
        out["srun"] = (slurm.srun_argv(4, PARAMSHARD, "run", *job, extra=["--kill-on-bad-exit=1"]),
                       slurm.environ())
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    from tests.engines.slurm import SlurmCluster, slurm_problem
    slurm = None if slurm_problem() else SlurmCluster()
    try:
        cmds = commands(slurm)
        times = {name: [] for name in cmds}
        for rep in range(args.repeats):
            order = list(cmds) if rep % 2 == 0 else list(reversed(cmds))
            for name in order:
                argv, env = cmds[name]
                result = run_job(argv, env=env, timeout=180)
                if result.code != 0 or "oracle ok" not in result.output:
                    raise SystemExit(f"{name} failed:\n{result}")
                times[name].append(result.seconds)
        rows = [(name, f"{statistics.median(t):.2f}", f"{min(t):.2f}", f"{max(t):.2f}") for name, t in times.items()]
        notes = [f"{args.repeats} interleaved runs each; one sync step of a 577-parameter model, so this is "
                 f"start-up and shutdown cost (Python and torch imports dominate)."]
        if slurm is not None:
            notes.append(f"Slurm cluster start-up (munged, slurmctld, slurmd), once: {slurm.startup_seconds:.1f} s.")
        C.emit(args.markdown, [("whole-job seconds, 2 servers + 2 trainers, 1 step",
                                ["engine", "median s", "min s", "max s"], rows, [False, True, True, True])], notes)
    finally:
        if slurm is not None:
            slurm.close()


if __name__ == "__main__":
    main()
