"""How long a job stands still when a server is killed: restart in place and roll back.

`paramshard launch --servers 2 --trainers 2 --checkpoint-dir D --checkpoint-every 5
--max-restarts 1` runs tests/e2e/scripts/resumable.py (a 2-trainer sync job,
dense + sparse, 0.1 s a step); 0.55 s after checkpoint 5 is written, server 1
gets SIGKILL. Measured from the kill (wall clock of this process, reading the
job's output as it comes): until the launcher restarted the server, and until
both trainers logged their rollback (training resumes right after). Also the
steps replayed, and whether the job then ended with the same model as an
undisturbed run (sha256 of every parameter and row).

    .venv/bin/python benchmarks/recovery_time.py [--reps 3] [--markdown]
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


def one_run(extra: list[str], kill: bool) -> dict:
    ckpt = Path(tempfile.mkdtemp(prefix="paramshard-recovery-"))
    mark = f"recovery-{time.time_ns()}"
    argv = [PARAMSHARD, "launch", "--servers", "2", "--trainers", "2", *extra, SCRIPT, "--steps", "30",
            "--step-delay", "0.1"]
    if kill:
        argv[4:4] = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "5", "--max-restarts", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**os.environ, MARK: mark, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"},
                            start_new_session=True)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: [lines.append((time.monotonic(), l)) for l in proc.stdout], daemon=True)
    reader.start()
    killed_at = None
    try:
        if kill:
            deadline = time.monotonic() + 60
            while not (ckpt / "step-00000005").is_dir():
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("no checkpoint at step 5")
                time.sleep(0.01)
            time.sleep(0.55)
            victim = rank_pids(mark, "server", 1)
            killed_at = time.monotonic()
            os.kill(victim[0], signal.SIGKILL)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join(5)
    text = "".join(line for _, line in lines)
    if proc.returncode != 0:
        raise SystemExit(f"job failed ({proc.returncode}):\n{text[-4000:]}")
    out = {"hash": re.search(r"final ([0-9a-f]{64})", text).group(1)}
    if kill:
        restarted = next(t for t, line in lines if "restarting it in place" in line)
        rolled = [(t, line) for t, line in lines if "steps are trained again" in line]
        out["restart_s"] = restarted - killed_at
        out["resumed_s"] = max(t for t, _ in rolled) - killed_at
        out["replayed"] = max(int(re.search(r"(\d+) steps are trained again", line).group(1)) for _, line in rolled)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    undisturbed = one_run([], kill=False)["hash"]
    runs = [one_run([], kill=True) for _ in range(args.reps)]
    same = sum(r["hash"] == undisturbed for r in runs)
    rows = [("launcher restarts the dead server", f"{statistics.median(r['restart_s'] for r in runs):.2f} s"),
            ("both trainers rolled back (training resumes)", f"{statistics.median(r['resumed_s'] for r in runs):.2f} s"),
            ("steps replayed", f"{statistics.median(r['replayed'] for r in runs):g}"),
            ("final model equal to an undisturbed run", f"{same} of {len(runs)}")]
    C.emit(args.markdown, [("after kill -9 of server 1 (medians)", ["measured from the kill", "value"], rows,
                            [False, True])], [f"{args.reps} runs. {C.machine_note()}"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
