"""Helpers shared by the benchmark scripts: child processes that are always torn
down, paramshard servers started through the environment contract, and tables.

Every child is tracked by the PID this process started, stopped with
SIGTERM -> wait -> SIGKILL, and never looked up by name. Every wait has a timeout.
"""
from __future__ import annotations

import ctypes
import datetime
import multiprocessing
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterable, Sequence

MiB = 1 << 20
HOST = "127.0.0.1"   # all benchmark traffic stays on loopback
SPAWN = multiprocessing.get_context("spawn")

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """preexec_fn: the kernel SIGTERMs the child if this process dies, even by SIGKILL."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def install_sigterm_as_exit() -> None:
    """A SIGTERM to the benchmark runs its ``finally`` blocks (children get torn down)."""
    def _exit(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, _exit)


class Children:
    """Owns the processes a benchmark starts; ``stop_all`` always tears them down."""

    def __init__(self):
        self.popen: list[tuple[str, subprocess.Popen, str]] = []   # (tag, proc, log path)
        self.mp: list[tuple[str, multiprocessing.Process, object]] = []  # (tag, proc, conn)

    # -- subprocesses -------------------------------------------------------
    def spawn(self, tag: str, argv: Sequence[str], env: dict) -> subprocess.Popen:
        log = tempfile.NamedTemporaryFile(prefix="bench-" + re.sub(r"[^A-Za-z0-9]+", "_", tag) + "-", suffix=".log",
                                          delete=False)
        proc = subprocess.Popen(list(argv), env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_die_with_parent)
        log.close()
        self.popen.append((tag, proc, log.name))
        return proc

    def check_alive(self) -> None:
        for tag, proc, log in self.popen:
            if proc.poll() is not None:
                raise RuntimeError(f"{tag} (pid {proc.pid}) exited with code {proc.returncode}; "
                                   f"its log:\n{tail(log)}")
        for tag, proc, _ in self.mp:
            if not proc.is_alive():
                raise RuntimeError(f"{tag} (pid {proc.pid}) exited with code {proc.exitcode}")

    # -- multiprocessing children (spawn) ------------------------------------
    def start_mp(self, tag: str, target: Callable, args: tuple = ()):
        """Start ``target(conn, *args)`` in a spawned process; returns our end of the pipe."""
        ours, theirs = SPAWN.Pipe()
        proc = SPAWN.Process(target=target, args=(theirs, *args), name=tag, daemon=True)
        proc.start()
        theirs.close()
        self.mp.append((tag, proc, ours))
        return ours

    def stop_all(self, grace: float = 5.0) -> None:
        for _, _, conn in self.mp:        # polite first: children leave their loops on None/EOF
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        for tag, proc, log in self.popen:
            _stop_pid(proc, grace)
            try:
                os.unlink(log)
            except OSError:
                pass
        for tag, proc, conn in self.mp:
            proc.join(grace)
            if proc.is_alive():
                proc.terminate()
                proc.join(grace)
            if proc.is_alive():
                proc.kill()
                proc.join(grace)
            conn.close()
        self.popen.clear()
        self.mp.clear()


def _stop_pid(proc: subprocess.Popen, grace: float) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)      # only the PID we started
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace)


def tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


def run_for_results(children: "Children", tag: str, argv: list[str], environ: dict, result: str,
                    trainers: int, timeout: float, results_suffice: bool = False,
                    on_poll: Callable[[int], None] | None = None) -> list[dict]:
    """Run one job (a process, or a launcher and its ranks) to its end or its deadline and
    return the trainers' ``trainer-*.json`` from the ``result`` directory; the job is
    stopped in every case. ``results_suffice``: a job that wrote every result but has not
    exited by the deadline is stopped with a warning instead of failing. ``on_poll(pid)`` is
    called with the job's pid every poll (0.1 s) while it runs (cpu_budget samples there)."""
    import json
    from pathlib import Path
    result = Path(result)
    try:
        proc = children.spawn(tag, argv, environ)
        log = children.popen[-1][2]
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            if on_poll is not None:
                on_poll(proc.pid)
            if time.monotonic() > deadline:
                if results_suffice and len(list(result.glob("trainer-*.json"))) == trainers:
                    print(f"  warning: {tag} wrote its results but had not exited after {timeout:g} s; stopped",
                          file=sys.stderr, flush=True)
                    break
                raise TimeoutError(f"{tag} did not finish within {timeout:g} s; its log:\n{tail(log, 40)}")
            time.sleep(0.1)
        if proc.returncode not in (None, 0):
            raise RuntimeError(f"{tag} exited with code {proc.returncode}; its log:\n{tail(log, 40)}")
        files = sorted(result.glob("trainer-*.json"))
        if len(files) != trainers:
            raise RuntimeError(f"{tag}: {len(files)} result files for {trainers} trainers; its log:\n{tail(log, 40)}")
        return [json.loads(f.read_text()) for f in files]
    finally:
        children.stop_all()


def recv_with_timeout(conn, timeout: float, what: str):
    if not conn.poll(timeout):
        raise TimeoutError(f"no answer from {what} within {timeout:g} s")
    return conn.recv()


# -- paramshard servers ---------------------------------------------------------
def start_paramshard_cluster(children: Children, num_servers: int, num_trainers: int = 1,
                             mode: str = "sync", timeout: float = 60.0, extra_env: dict | None = None) -> list[str]:
    """``python -m paramshard server`` per server, configured by the environment
    contract only (``extra_env``: more variables for every server, e.g. PARAMSHARD_ROW_STORE).
    Returns the server addresses (readiness: see ``wait_servers``)."""
    from paramshard.launch.engines.ports import free_ports
    addresses = [f"{HOST}:{p}" for p in free_ports(num_servers, HOST)]
    for sid in range(num_servers):
        env = dict(os.environ, PARAMSHARD_ROLE="server", PARAMSHARD_SERVERS=",".join(addresses),
                   PARAMSHARD_SERVER_ID=str(sid), PARAMSHARD_TRAINERS=str(num_trainers),
                   PARAMSHARD_MODE=mode, PARAMSHARD_TIMEOUT=str(timeout), **(extra_env or {}))
        children.spawn(f"paramshard server {sid}/{num_servers}",
                       [sys.executable, "-m", "paramshard", "server"], env)
    return addresses


def wait_servers(children: Children, links, timeout: float = 30.0) -> None:
    """Say hello to every server until all answer; fail early if a server process died."""
    from paramshard.errors import DeadlineExceeded
    deadline = time.monotonic() + timeout
    while True:
        children.check_alive()
        try:
            links.request_many({i: ({"op": "hello"}, ()) for i in range(len(links))}, timeout=1.0)
            return
        except DeadlineExceeded:
            if time.monotonic() > deadline:
                raise


# -- numbers and tables ------------------------------------------------------------
def median(xs: Iterable[float]) -> float:
    return statistics.median(list(xs))


def quartiles(xs: Sequence[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def size_label(nbytes: int) -> str:
    return f"{nbytes // MiB} MiB" if nbytes % MiB == 0 else f"{nbytes} B"


def machine_note() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    return (f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; {platform.node() or 'host'}: "
            f"{os.cpu_count()} vCPU, {platform.machine()}, Linux {platform.release()}; "
            f"Python {platform.python_version()}; load average {load[0]:.2f} at start")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> str:
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)


def rich_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]):
    from rich.table import Table
    table = Table(title=title)
    for h, r in zip(headers, right):
        table.add_column(h, justify="right" if r else "left")
    for row in rows:
        table.add_row(*row)
    return table


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM of a process, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def emit(markdown: bool, tables: Sequence[tuple], notes: Sequence[str] = ()) -> None:
    """Print ``tables`` ([(title, headers, rows, right)]) and ``notes``: markdown
    for RESULTS.md, or rich tables for a terminal."""
    if markdown:
        for _title, headers, rows, right in tables:
            print(markdown_table(headers, rows, right))
            print()
        for note in notes:
            print(f"_{note}_")
            print()
        return
    from rich.console import Console
    from paramshard.observe.live.terminal import is_live_terminal
    # colours only for a terminal someone watches (not a file, nor a rank under mpirun)
    console = Console(width=max(Console().width, 120), force_terminal=is_live_terminal(sys.stdout))
    for title, headers, rows, right in tables:
        console.print(rich_table(title, headers, rows, right))
    for note in notes:
        console.print(note)


def serve_router(conn, host: str, answer: Callable) -> None:
    """A child process's ROUTER loop: sends its port over ``conn``, replies to each
    message with ``answer(frames)`` and stops when the parent writes to (or closes) ``conn``."""
    import zmq
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    conn.send(sock.bind_to_random_port(f"tcp://{host}"))
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    try:
        while not conn.poll(0):            # None from the parent, or EOF if it died
            if poller.poll(100):
                frames = sock.recv_multipart(copy=False)
                sock.send_multipart(answer(frames), copy=False)
                del frames   # libzmq holds its own reference until sent; keep no big buffer alive
    finally:
        sock.close(0)
        ctx.term()


def mem_available() -> int:
    """Bytes the kernel says can still be allocated (MemAvailable)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")
