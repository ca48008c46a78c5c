"""One fork server shared by many launchers (PARAMSHARD_FORK_SERVER): the imports paid once for
every job started on this machine while it runs, not once a job.

    python -m paramshard.launch.engines.zygote_host PATH

A launcher's own zygote (launch/engines/zygote.py, started by launch/engines/fork_server.py)
spends 2-3 s of CPU importing torch, pandas, numba and paramshard before its first rank; a test
suite or a developer starting many short jobs pays that for each. This host imports them once,
then listens on a Unix SOCK_SEQPACKET socket at PATH (in a directory only this user can enter:
whoever connects runs code as this user). For each launcher that connects it forks a zygote
that has everything imported already and serves that one connection exactly as a launcher's
own zygote serves its socket pair (the same protocol and code: zygote.Zygote), so a job's ranks,
their exits and their end when the launcher goes are what they are without the host.

Ownership: the host is its starter's (the test session's) and ends when its starter ends
(the parent-death guard) or is signalled; each connection's zygote dies with the host
(PR_SET_PDEATHSIG) and its ranks with it. The host runs no code of any job: a job cannot leave
state behind for the next one, which forks afresh from the host's untouched imports.
"""
from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from paramshard.launch.engines import zygote

_PR_SET_PDEATHSIG = 1
LISTEN_BACKLOG = 64


def load_time_environ() -> dict[str, str]:
    """The variables of this host a rank must share to be forked from it (fork_server._load_time)."""
    from paramshard.launch.engines.fork_server import _load_time
    return {k: v for k, v in os.environ.items() if _load_time(k)}


def listen(path: str) -> socket.socket:
    """The host's socket at ``path``: bound before the imports, so a launcher that connects
    early waits in the backlog for its zygote's ready message instead of failing."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(LISTEN_BACKLOG)
    return sock


def serve_connection(conn: socket.socket, host_pid: int) -> list[str] | None:
    """In a zygote forked for one launcher: die with the host, say ready, serve the launcher.
    Returns a forked rank's argv (in the rank) or None (the launcher went: the zygote exits)."""
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        os.write(2, b"paramshard zygote host: prctl(PR_SET_PDEATHSIG) failed\n")
    if os.getppid() != host_pid:
        os._exit(0)                 # the host died already: the signal will never come
    zygote._send(conn, {"ready": True, "pid": os.getpid(), "threads": zygote.thread_names(),
                        "python": sys.executable, "environ": load_time_environ()})
    return zygote.Zygote(conn).serve()


def serve(listener: socket.socket) -> list[str] | None:
    """Accept launchers for ever, one forked zygote each. Returns only in a forked child:
    a rank's argv (main() runs it) or None (that zygote's launcher went)."""
    host_pid = os.getpid()
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    while True:
        if poller.poll(1000):
            conn, _ = listener.accept()
            pid = os.fork()
            if pid == 0:
                listener.close()
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                try:
                    return serve_connection(conn, host_pid)
                except BaseException as exc:     # noqa: BLE001 - the child must never return to this loop
                    os.write(2, f"paramshard zygote host: a launcher's zygote failed: {exc!r}\n".encode())
                    os._exit(1)
            conn.close()
        _reap()


def _reap() -> None:
    """The zygotes whose launchers went (the host's only children)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def start(path: str, timeout: float = 120.0, wait_ready: bool = True) -> subprocess.Popen:
    """Start a host at ``path`` for this process's local launches (it dies with this process).
    Its environment is the one a local rank's zygote would have, so that launchers started from
    here fork their ranks from it. ``wait_ready``: return once it has imported everything;
    otherwise once its socket is bound (2-3 s of CPU sooner): a launcher that connects while
    it imports waits for its zygote's ready message (ForkServer.connect's deadline)."""
    from paramshard.launch.api import MALLOC_TUNABLES
    from paramshard.launch.engines.fork_server import zygote_environ
    from paramshard.launch.engines.local import rank_base_environ
    from paramshard.launch.engines.processes import guarded_argv
    environ = rank_base_environ()
    environ.setdefault("GLIBC_TUNABLES", MALLOC_TUNABLES)
    proc = subprocess.Popen(guarded_argv([sys.executable, "-m", "paramshard.launch.engines.zygote_host", path]),
                            env=zygote_environ(environ), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE if wait_ready else subprocess.DEVNULL,
                            start_new_session=True, text=True)
    deadline = time.monotonic() + timeout
    if wait_ready:
        ready: list[str] = []
        reader = threading.Thread(target=lambda: ready.append(proc.stdout.readline() if proc.stdout else ""),
                                  daemon=True)
        reader.start()
        reader.join(timeout)
        up = bool(ready) and ready[0].strip() == "ready"
        if proc.stdout is not None:
            proc.stdout.close()
    else:
        while not os.path.exists(path) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        up = os.path.exists(path)
    if not up:
        proc.kill()
        proc.wait(10)
        raise RuntimeError(f"the shared fork server (pid {proc.pid}) did not {'get ready' if wait_ready else 'bind'} "
                           f"{path} within {timeout:.0f} s (exit {proc.returncode}; its error is above)")
    return proc


def main() -> None:
    path = sys.argv[1]
    listener = listen(path)
    # Ctrl-C at the starter's terminal is the starter's to handle; it stops the host by PID.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    zygote.preload([*zygote.FIRST, *zygote.LATER])
    threads = zygote.thread_names()
    if len(threads) > 1:
        # Forking a process with threads copies only the forking one (fork_server.py says why that hangs).
        print(f"paramshard zygote host: {len(threads)} threads after the imports ({', '.join(threads)}); "
              f"it cannot fork safely", file=sys.stderr)
        sys.exit(1)
    print("ready", flush=True)
    # The starter closes its end after that line: nothing of the host's may write there again.
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    argv = serve(listener)
    if argv is None:
        os._exit(0)
    zygote.finish(argv)


if __name__ == "__main__":
    main()
