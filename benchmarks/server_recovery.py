"""A killed server, bounded-loss recovery against today's rollback (issue 24, item 4).

Both kinds run the same async job through `paramshard launch --mode async --servers 2
--trainers 2 ... --max-restarts 1` (tests/e2e/scripts/resumable.py, dense + sparse,
0.05 s a step, 240 steps); server 1 gets SIGKILL once the launcher's progress shows a
trainer at step 40.

- rollback: `--checkpoint-dir D --checkpoint-every 5` (today): the trainers roll back
  to the latest checkpoint; serving again = both trainers logged their rollback;
  updates lost = the steps they train again, summed over the trainers.
- bounded-loss: `--recovery bounded-loss` (no checkpoints): the launcher's replica
  keeper restores its copy; serving again = the keeper logged the restore; updates
  lost = its estimate (pushes a second x the copy's age at the kill).

Measured from the kill, in this process's clock, reading the job's output as it comes.
Then the exact count: the in-process exact-sum harness (tests/integration/
bounded_loss_harness.py: 2 servers, 4 async trainers, kill -9 of server 1) counts the
pushes actually lost against those the old server answered in its last second. Last,
the cost of the change log on a push (in-process, no sockets).

    PYTHONPATH=src .venv/bin/python benchmarks/server_recovery.py [--reps 3] [--markdown]
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from tests.e2e.run_job import MARK, PARAMSHARD, VENV_BIN, rank_pids  # noqa: E402

SCRIPT = str(ROOT / "tests" / "e2e" / "scripts" / "resumable.py")
KILL_AT_STEP = 40       # in the steady state: the launcher's progress line shows a trainer at this step


def one_run(kind: str) -> dict:
    ckpt = Path(tempfile.mkdtemp(prefix="paramshard-server-recovery-"))
    mark = f"server-recovery-{time.time_ns()}"
    extra = (["--recovery", "bounded-loss"] if kind == "bounded-loss" else
             ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "5"])
    argv = [PARAMSHARD, "launch", "--mode", "async", "--servers", "2", "--trainers", "2", "--max-restarts", "1",
            "--run-dir", str(ckpt / "run"), *extra, SCRIPT, "--steps", "240", "--step-delay", "0.05"]
    env = {**os.environ, MARK: mark, "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env,
                            start_new_session=True)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: [lines.append((time.monotonic(), l)) for l in proc.stdout], daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not any(int(m.group(1)) >= KILL_AT_STEP for _, l in lines
                      for m in [re.search(r"progress \| trainer \d+: step (\d+)", l)] if m):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the job did not get going:\n" + "".join(l for _, l in lines)[-3000:])
            time.sleep(0.01)
        victim = rank_pids(mark, "server", 1)
        killed_at = time.monotonic()
        os.kill(victim[0], signal.SIGKILL)
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join(5)
    text = "".join(line for _, line in lines)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} job failed ({proc.returncode}):\n{text[-4000:]}")
    if kind == "bounded-loss":
        t, line = next((t, l) for t, l in lines if "serves again from its replica" in l)
        lost = float(re.search(r"\(about ([\d.]+) trainer steps\)", line).group(1))
    else:
        rolled = [(t, l) for t, l in lines if "steps are trained again" in l]
        t = max(t for t, _ in rolled)
        lost = sum(int(re.search(r"(\d+) steps are trained again", l).group(1)) for _, l in rolled)
    return {"serving_s": t - killed_at, "lost": lost}


def exact_runs(reps: int) -> list:
    from tests.conftest import Cluster
    from tests.integration.bounded_loss_harness import run
    outs = []
    for _ in range(reps):
        made = []

        def cluster(**kw):
            made.append(Cluster(kw.pop("servers"), kw.pop("trainers"), kw.pop("mode"), kw.pop("timeout"), **kw))
            return made[-1]
        try:
            outs.append(run(cluster))
        finally:
            for c in made:
                c.close()
    return outs


def push_cost(reps: int) -> dict:
    """Median seconds of an async push_sparse (4096 random ids of a 1M-row compiled table, dim 16,
    Adagrad) without and with the change log bounded-loss keeps (server/replication.DirtyPages)."""
    import numpy as np
    import paramshard as ps
    from paramshard.mode import Mode
    from paramshard.server.core.barrier import Membership
    from paramshard.server.elastic.replication import DirtyPages
    from paramshard.server.storage.row_stores import store_named
    from paramshard.server.storage.sparse_table import SparseTable
    from paramshard.tables import Admission, Eviction
    rng = np.random.default_rng(0)
    batches = [np.unique(rng.integers(0, 1_000_000, 4096).astype(np.uint64)) for _ in range(200)]
    out = {False: [], True: []}
    for _ in range(reps):
        for track in (False, True):
            t = SparseTable("t", 16, 1, ps.optim.Adagrad(lr=0.1), Admission(), Eviction(), 0.01, mode=Mode.ASYNC,
                            membership=Membership(1, grace=5.0), store=store_named("compiled"))
            t.reserve(1_000_000)
            t.pull(np.arange(1_000_000, dtype=np.uint64), 0)
            if track:
                t.changes = DirtyPages()
                t.changes.take(t.num_rows)
            for i, ids in enumerate(batches):
                grads = np.ones((len(ids), 16), np.float32)
                t.pull(ids, 0)
                started = time.perf_counter()
                t.push(0, i, ids, grads, distinct=True)
                out[track].append(time.perf_counter() - started)
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    runs = {kind: [one_run(kind) for _ in range(args.reps)] for kind in ("rollback", "bounded-loss")}
    exact = exact_runs(args.reps)
    cost = push_cost(args.reps)
    med = statistics.median
    rows = [(kind, f"{med(r['serving_s'] for r in rs):.2f} s", f"{med(r['lost'] for r in rs):g}")
            for kind, rs in runs.items()]
    exact_rows = [("serving again after kill -9", f"{med(o.serving_again_s for o in exact):.2f} s"),
                  ("pushes lost (exact)", f"{med(o.lost_pushes for o in exact):g}"),
                  ("keeper's estimate of them", f"{med(o.restored['updates_lost_estimate'] for o in exact):g}"),
                  ("pushes server 1 answered in its last second", f"{med(o.answered_last_second for o in exact):g}")]
    C.emit(args.markdown, [
        ("kill -9 of server 1, async job through `paramshard launch` (medians)",
         ["recovery", "serving again after the kill", "updates lost (rollback: steps trained again)"], rows,
         [False, True, True]),
        ("bounded-loss, exact-sum harness: 4 async trainers (medians)", ["measured", "value"], exact_rows,
         [False, True]),
        ("cost on a push: async push_sparse of 4096 ids, 1M-row table (medians)", ["server", "push"],
         [("rollback (no change log)", f"{cost[False] * 1e6:.0f} us"),
          ("bounded-loss (pages marked)", f"{cost[True] * 1e6:.0f} us")], [False, True])],
        [f"{args.reps} runs each. {C.machine_note()}"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
