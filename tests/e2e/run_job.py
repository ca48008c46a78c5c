"""Run a whole job under an engine as the user would, with a deadline, and check
that none of its processes outlives it."""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from paramshard.launch.api import MALLOC_TUNABLES

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
PARAMSHARD = str(VENV_BIN / "paramshard")
ORACLE = str(REPO / "tests" / "e2e" / "scripts" / "sync_oracle.py")
MARK = "PSTEST_JOB_MARK"   # not PARAMSHARD_*: launchers pass those on only as their own contract


@dataclasses.dataclass
class JobResult:
    code: int
    output: str
    seconds: float
    leftovers: list[int]

    def __str__(self) -> str:
        return f"exit {self.code} after {self.seconds:.1f} s, leftovers {self.leftovers}\n{self.output[-6000:]}"


def processes_marked(mark: str) -> list[int]:
    """PIDs whose environment carries ``mark``: every process of one test job."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def environ_of(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def rank_pids(mark: str, role: str, index: int) -> list[int]:
    """PIDs of ``role`` ``index`` (e.g. server 1) among the processes of the job marked ``mark``."""
    key = "PARAMSHARD_SERVER_ID" if role == "server" else "PARAMSHARD_TRAINER_ID"
    return [pid for pid in processes_marked(mark)
            if environ_of(pid).get("PARAMSHARD_ROLE") == role and environ_of(pid).get(key) == str(index)]


def run_job(argv: list[str], env: dict | None = None, timeout: float = 120.0, cwd: str | Path = REPO,
            settle: float = 5.0, malloc_tuned: bool = True) -> JobResult:
    """Run ``argv`` in its own process group; kill the group at the deadline. After it
    exits, wait up to ``settle`` s for its processes to end, then kill (and report) the rest.

    ``malloc_tuned``: the job starts with the malloc settings (GLIBC_TUNABLES) that `paramshard run`
    would otherwise restart each rank with (cli/jobs/run.py), which costs each rank a second start of
    Python and of `import paramshard` (about 1 s of CPU, most of it pandas). The first job of each
    engine passes False and takes that path."""
    mark = uuid.uuid4().hex
    tuned = {"GLIBC_TUNABLES": MALLOC_TUNABLES} if malloc_tuned else {}
    full_env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", **tuned, **(env or {}), MARK: mark}
    if not malloc_tuned:
        full_env.pop("GLIBC_TUNABLES", None)
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=full_env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        output += f"\n[test: killed after the {timeout:g} s deadline]"
    seconds = time.monotonic() - started
    deadline = time.monotonic() + settle
    left = processes_marked(mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = processes_marked(mark)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return JobResult(proc.returncode, output, seconds, left)
