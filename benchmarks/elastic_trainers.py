"""Trainers joining and leaving a running job (issue 24, item 2): how long the others stall.

Each repetition runs `paramshard launch --servers 1 --trainers 2:3 --mode M --max-restarts 1`
on tests/e2e/scripts/elastic.py (a small dense model, 0.03 s of sleep a step) and, once every
trainer is past step 30:
1. kill -9 trainer 1 (the launcher replaces it alone; the new process joins);
2. `paramshard scale RUN_DIR --trainers 2` (trainer 2 leaves at a step boundary);
3. `paramshard scale RUN_DIR --trainers 3` (a new trainer 2 joins).
The stall of an event: the longest step of the trainers it did not touch (their records'
``step_max_s``, the longest time between two step ends) from the event until 5 s after it,
against the longest step in the 5 s before the kill (the baseline). Async and sync
repetitions interleaved; medians.

    PYTHONPATH=src .venv/bin/python benchmarks/elastic_trainers.py [--repeats 3] [--markdown]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
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

SCRIPT = str(ROOT / "tests" / "e2e" / "scripts" / "elastic.py")
WINDOW = 5.0


class Job:
    def __init__(self, mode: str, folder: Path):
        self.run_dir, self.stop = folder / "run", folder / "stop"
        self.mark = f"elastic-trainers-{time.time_ns()}"
        env = {**os.environ, MARK: self.mark, "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
               "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        self.env = env
        self.proc = subprocess.Popen(
            [PARAMSHARD, "launch", "--servers", "1", "--trainers", "2:3", "--mode", mode, "--max-restarts", "1",
             "--timeout", "20", "--run-dir", str(self.run_dir), SCRIPT, str(self.stop)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env, start_new_session=True)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()

    def wait_for(self, pattern: str, seconds: float = 90.0) -> None:
        end = time.monotonic() + seconds
        while not any(re.search(pattern, line) for line in list(self.lines)):
            if time.monotonic() > end or self.proc.poll() is not None:
                raise SystemExit(f"no {pattern!r}:\n" + "".join(self.lines)[-4000:])
            time.sleep(0.05)

    def scale(self, n: int) -> None:
        done = subprocess.run([PARAMSHARD, "scale", str(self.run_dir), "--trainers", str(n)], capture_output=True,
                              text=True, timeout=60, cwd=ROOT, env=self.env)
        if done.returncode:
            raise SystemExit(done.stderr)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def longest_step(records: list[dict], begin: float, end: float, skip: set[int]) -> float:
    """The longest step of the trainers not in ``skip`` whose record falls in [begin, end + 1)."""
    values = [r["step_max_s"] for r in records if r.get("kind") == "trainer" and r["trainer"] not in skip
              and begin <= r["t"] < end + 1.0 and isinstance(r.get("step_max_s"), (int, float))]
    return max(values, default=float("nan"))


def one_run(mode: str) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="paramshard-elastic-trainers-"))
    job = Job(mode, folder)
    at = {}
    try:
        for t in range(3):
            job.wait_for(rf"trainer {t} at step [3-9]\d")
        [victim] = rank_pids(job.mark, "trainer", 1)
        at["kill"] = time.time()
        os.kill(victim, signal.SIGKILL)
        job.wait_for(r"trainer 1 first step [1-9]")
        time.sleep(WINDOW)
        at["leave"] = time.time()
        job.scale(2)
        job.wait_for(r"trainer 2 left on request")
        time.sleep(WINDOW)
        at["join"] = time.time()
        job.scale(3)
        job.wait_for(r"trainer 2 first step [1-9]")
        time.sleep(WINDOW)
        job.stop.touch()
        if job.proc.wait(timeout=120) != 0:
            raise SystemExit("the job failed:\n" + "".join(job.lines)[-4000:])
    finally:
        job.close()
    records = [json.loads(line) for line in (job.run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"baseline": longest_step(records, at["kill"] - WINDOW, at["kill"], set()),
            "kill": longest_step(records, at["kill"], at["kill"] + WINDOW, {1}),
            "leave": longest_step(records, at["leave"], at["leave"] + WINDOW, {2}),
            "join": longest_step(records, at["join"], at["join"] + WINDOW, {2})}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--markdown", action="store_true")
    a = p.parse_args()
    C.install_sigterm_as_exit()
    runs = {"async": [], "sync": []}
    for _ in range(a.repeats):
        for mode in runs:                       # interleaved
            runs[mode].append(one_run(mode))
            print(f"{mode}: {runs[mode][-1]}", file=sys.stderr, flush=True)
    rows = [[mode, *(f"{C.median([r[k] for r in rs]):.2f}" for k in ("baseline", "kill", "leave", "join"))]
            for mode, rs in runs.items()]
    C.emit(a.markdown, [("Longest step of the other trainers (s), medians", ["mode", "before (baseline)",
                          "trainer killed (replaced alone)", "one asked to leave", "one joining"], rows,
                         [False, True, True, True, True])],
           [f"{a.repeats} repetitions per mode, interleaved; {C.machine_note()}",
            "goal: the others continue within 3 s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
