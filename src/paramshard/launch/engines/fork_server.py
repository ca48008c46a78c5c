"""`paramshard launch --fork`: ranks forked from one interpreter that has imported torch,
numpy, pandas, numba, zmq and paramshard, instead of each starting Python anew.

A rank's start is mostly imports (1-2 s of CPU each); S + T ranks on a small machine pay
them S + T times over, side by side. The zygote (launch/engines/zygote.py) pays them once; each
rank is then a fork of it that runs its entry point as `python ...` would. The zygote is
this launcher's child; the ranks are the zygote's, so the launcher learns a rank's exit
from the zygote (``ForkedProc``, the part of Popen that launch/engines/processes.py's Child
uses). The wire is JSON over a SOCK_SEQPACKET socket pair, the rank's output pipe passed
with SCM_RIGHTS; nothing is on the file system.

A rank is forked only when a new interpreter would start the same way: the same Python
and the same variables read at interpreter or library load (``LOAD_TIME``); otherwise it
is started as a new process (``reason_not_to_fork``). No process outlives the launcher:
the zygote runs behind the parent-death guard and SIGKILLs its ranks when the launcher's
end of the socket closes; each rank has PR_SET_PDEATHSIG on the zygote; the launcher's
guardian (processes.py) lists the ranks' groups as it lists any child's.
"""
from __future__ import annotations

import atexit
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from paramshard.errors import ConfigError
from paramshard.log import get_logger
from paramshard.launch.engines.processes import guarded_argv
from paramshard.launch.engines.zygote import ENV_ROOM
from paramshard.settings.process_variables import FORK_SERVER

log = get_logger("launch")

READY_TIMEOUT = 120.0      # the zygote's first imports; seconds of CPU on a busy machine
FORK_TIMEOUT = 120.0       # a trainer's fork waits for the rest of them
# Read once when the interpreter or a library loads: a rank whose value differs from the
# zygote's would not get its own, so it starts as a new process instead.
LOAD_TIME_PREFIXES = ("PYTHON", "LD_", "MALLOC_", "JE_", "OPENBLAS_", "GOTO_", "NUMBA_", "KMP_", "CUDA_")
LOAD_TIME = ("GLIBC_TUNABLES",)
# Every rank has the first; the hash seed is the zygote's (str hashes of one job's ranks agree).
NOT_LOAD_TIME = ("PYTHONUNBUFFERED", "PYTHONHASHSEED")
# Set in the zygote only when unset: its imports must start no thread (a fork copies only the
# forking thread). numpy's OpenBLAS starts a pool of OMP_NUM_THREADS - 1 threads at import, pyarrow
# (pandas) a jemalloc background thread; a forked rank goes without both (numpy's BLAS runs on one
# thread, jemalloc purges on its allocation paths instead).
ENV_ROOM_BYTES = 32768
QUIET_IMPORTS = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}


def _load_time(name: str) -> bool:
    return ((name.startswith(LOAD_TIME_PREFIXES) or name in LOAD_TIME)
            and name not in NOT_LOAD_TIME and name not in QUIET_IMPORTS and name != ENV_ROOM)


def zygote_environ(rank_environ: dict[str, str]) -> dict[str, str]:
    """The zygote's environment: a rank's, without its contract (PARAMSHARD_*), with imports kept quiet."""
    env = {k: v for k, v in rank_environ.items() if not k.startswith("PARAMSHARD_")}
    env["PYTHONUNBUFFERED"] = "1"
    for name, value in QUIET_IMPORTS.items():
        env.setdefault(name, value)
    # Room in the zygote's environment block for each rank's own, which a rank writes over it so
    # that /proc/PID/environ shows its variables (zygote._show_environ).
    env[ENV_ROOM] = "." * ENV_ROOM_BYTES
    return env


class ForkedProc:
    """A rank forked by the zygote, seen as launch/engines/processes.py sees a Popen: pid, returncode,
    poll, wait, stdout (its output, merged), stdin (None), killpg."""

    def __init__(self, server: "ForkServer", pid: int, stdout, argv):
        self.server, self.pid, self.stdout, self.args = server, pid, stdout, argv
        self.stdin = None
        self.returncode: int | None = None
        self._cond = threading.Condition()

    def _exited(self, code: int) -> None:
        with self._cond:
            self.returncode = code
            self._cond.notify_all()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._cond:
            if not self._cond.wait_for(lambda: self.returncode is not None, timeout):
                assert timeout is not None      # without one, wait_for returns only once it holds
                raise subprocess.TimeoutExpired(self.args, timeout)
            code = self.returncode
            assert code is not None             # wait_for's predicate held, under the lock
            return code

    def killpg(self, sig: int) -> None:
        """Signal its process group. Under the lock that records its exit: until then the zygote
        keeps it a zombie, so the group id cannot belong to anyone else yet."""
        with self._cond:
            if self.returncode is not None:
                return
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                pass

    def send_signal(self, sig: int) -> None:
        with self._cond:
            if self.returncode is None:
                try:
                    os.kill(self.pid, sig)
                except ProcessLookupError:
                    pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The launcher's side of one zygote."""

    def __init__(self, environ: dict[str, str], python: str = sys.executable, preload=None):
        """``preload``: the modules the zygote imports (default: zygote.FIRST, then zygote.LATER)."""
        self.environ, self.python = environ, python
        self.preload = None if preload is None else tuple(preload)
        self.pid: int | None = None
        self.problem: str | None = None          # set: it cannot fork (why), ranks start unforked
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._send_lock = threading.Lock()
        self._fork_lock = threading.Lock()       # one fork at a time: replies come in order
        self._ids = itertools.count()
        self._replies: dict[int, dict] = {}
        self._replied = threading.Condition()
        self._procs: dict[int, ForkedProc] = {}
        self._early_exits: dict[int, int] = {}   # exits reported before the fork's reply was read
        self._reader: threading.Thread | None = None
        self._gone = False

    def start(self, timeout: float = READY_TIMEOUT) -> "ForkServer":
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [self.python, "-m", "paramshard.launch.engines.zygote", str(theirs.fileno()), *(self.preload or ())]
        if threading.current_thread() is threading.main_thread() and sys.platform.startswith("linux"):
            argv = guarded_argv(argv)           # PR_SET_PDEATHSIG: it dies with this launcher
        started = time.monotonic()
        try:
            self._proc = subprocess.Popen(argv, env=self.environ, pass_fds=(theirs.fileno(),),
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            theirs.close()
        self._sock = ours
        ours.settimeout(timeout)
        try:
            ready = json.loads(ours.recv(1 << 16) or b"null")
        except (socket.timeout, ValueError) as exc:
            self.close()
            raise ConfigError(f"--fork: the fork server (pid {self._proc.pid}) did not report ready within "
                              f"{timeout:.0f} s ({exc}); launch without --fork") from None
        ours.settimeout(None)
        if not ready:
            code = self._proc.wait(10)
            raise ConfigError(f"--fork: the fork server exited with code {code} before it was ready (its "
                              f"error is above); launch without --fork")
        self.pid = ready["pid"]
        if len(ready["threads"]) > 1:
            # Forking a process with other threads copies only the forking one: a lock another
            # held stays held in the child for ever.
            self.problem = (f"the fork server has {len(ready['threads'])} threads after its imports "
                            f"({', '.join(ready['threads'])}); forking it could hang a rank")
            log.warning("--fork: %s: every rank starts as a new process", self.problem)
        log.info("--fork: fork server (pid %d) ready in %.1f s", self.pid, time.monotonic() - started)
        self._reader = threading.Thread(target=self._read, args=(ours,), name="fork-server", daemon=True)
        self._reader.start()
        return self

    def connect(self, path: str, timeout: float = READY_TIMEOUT) -> "ForkServer":
        """Use a zygote of the shared host at ``path`` (launch/engines/zygote_host.py) instead of
        starting one: the host forks a zygote for this launcher that has imported everything
        already. Its python and load-time variables are the host's: a rank whose differ starts
        as a new process, as with a zygote of this launcher's own (``reason_not_to_fork``)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            ready = json.loads(sock.recv(1 << 16) or b"null")
        except (OSError, ValueError) as exc:
            sock.close()
            raise ConfigError(f"PARAMSHARD_FORK_SERVER={path}: no shared fork server answered ({exc}); start one "
                              f"(python -m paramshard.launch.engines.zygote_host PATH) or unset the variable") from None
        if not ready:
            sock.close()
            raise ConfigError(f"PARAMSHARD_FORK_SERVER={path}: the shared fork server closed the connection before "
                              f"its zygote was ready (the host's error is in its own output)")
        sock.settimeout(None)
        self._sock, self.pid = sock, ready["pid"]
        self.python, self.environ = ready["python"], ready["environ"]
        if len(ready["threads"]) > 1:
            self.problem = f"the shared fork server's zygote has {len(ready['threads'])} threads"
        log.info("--fork: fork server (pid %d) ready: a zygote of the shared one at %s", self.pid, path)
        self._reader = threading.Thread(target=self._read, args=(sock,), name="fork-server", daemon=True)
        self._reader.start()
        return self

    def reason_not_to_fork(self, argv, environ: dict[str, str]) -> str | None:
        """Why this rank cannot be forked from this zygote (None: it can)."""
        if self.problem or self._gone:
            return self.problem or "the fork server is gone"
        if not argv or argv[0] != self.python or len(argv) < 2 or (argv[1].startswith("-") and argv[1] != "-m"):
            return f"its command ({' '.join(argv[:2])} ...) is not `{self.python} SCRIPT` or `-m MODULE`"
        for name in sorted({*environ, *self.environ}):
            if _load_time(name) and environ.get(name) != self.environ.get(name):
                return f"its {name} differs from the fork server's (read when the interpreter starts)"
        return None

    def fork(self, argv, environ: dict[str, str], cwd: str | None = None, all_imports: bool = True,
             timeout: float = FORK_TIMEOUT) -> ForkedProc:
        """Fork a rank running ``argv`` (its stdout and stderr: one pipe, ForkedProc.stdout).
        ``all_imports``: False forks it as soon as the zygote has what a server imports at start
        (zygote.FIRST); True waits for the rest (zygote.LATER: torch, pandas, numba)."""
        write_end: int | None         # None once handed to the zygote and closed here
        read_end, write_end = os.pipe()
        message = {"op": "fork", "argv": list(argv), "env": environ, "cwd": cwd or os.getcwd(),
                   "all_imports": all_imports}
        try:
            with self._fork_lock:
                message["id"] = ident = next(self._ids)
                self._send(message, [write_end])
                os.close(write_end)
                write_end = None
                reply = self._await_reply(ident, timeout)
        except BaseException:
            os.close(read_end)
            if write_end is not None:
                os.close(write_end)
            raise
        if "error" in reply:
            os.close(read_end)
            raise ConfigError(f"--fork: the fork server could not start {argv[1:]}: {reply['error']}")
        proc = ForkedProc(self, reply["pid"], open(read_end, "r", errors="replace"), list(argv))
        with self._replied:
            self._procs[proc.pid] = proc
            early = self._early_exits.pop(proc.pid, None)
        if early is not None:
            self._record_exit(proc, early)
        return proc

    def _await_reply(self, ident: int, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        with self._replied:
            while ident not in self._replies:
                left = deadline - time.monotonic()
                if self._gone or left <= 0:
                    raise ConfigError(f"--fork: the fork server (pid {self.pid}) "
                                      f"{'exited' if self._gone else f'did not fork within {timeout:.0f} s'}; "
                                      f"launch without --fork")
                self._replied.wait(min(left, 1.0))
            return self._replies.pop(ident)

    def _send(self, message: dict, fds=()) -> None:
        data = json.dumps(message).encode()
        sock = self._sock
        assert sock is not None, "ForkServer.start() first"      # fork() and the reader come after it
        with self._send_lock:
            if fds:
                socket.send_fds(sock, [data], list(fds))
            else:
                sock.sendall(data)

    def _record_exit(self, proc: ForkedProc, code: int) -> None:
        proc._exited(code)
        try:
            self._send({"op": "reap", "pid": proc.pid})   # the zygote may now let the pid go
        except OSError:
            pass

    def _read(self, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            message = json.loads(data)
            with self._replied:
                if "forked" in message:
                    self._replies[message["forked"]] = message
                    self._replied.notify_all()
                    continue
                proc = self._procs.pop(message["exited"], None)
                if proc is None:
                    self._early_exits[message["exited"]] = message["code"]
                    continue
            self._record_exit(proc, message["code"])
        self._lost()

    def _lost(self) -> None:
        """The zygote is gone: its ranks died with it (their parent-death signal is SIGKILL)."""
        with self._replied:
            self._gone = True
            procs, self._procs = list(self._procs.values()), {}
            self._replied.notify_all()
        if procs and not self._closing:
            log.error("--fork: the fork server (pid %s) died; its ranks (pids %s) are killed with it",
                      self.pid, ", ".join(str(p.pid) for p in procs))
        for proc in procs:
            proc._exited(-int(signal.SIGKILL))

    _closing = False

    def close(self, timeout: float = 2.0) -> None:
        """Close the socket: the zygote SIGKILLs the ranks still running and exits. One busy
        importing notices only after that module: past ``timeout`` it is SIGKILLed, and what it
        still had dies of its parent-death signal (their groups: of the guardian's EOF next)."""
        self._closing = True
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._proc is not None:
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        if self._reader is not None:
            self._reader.join(5)
        if self._sock is not None:
            self._sock.close()


_shared: ForkServer | None = None
_shared_lock = threading.Lock()


def shared(rank_environ: dict[str, str]) -> ForkServer:
    """This launcher's one fork server, started for the first rank forked (every run of a job
    under the supervisor uses the same); with PARAMSHARD_FORK_SERVER, a zygote of that shared
    host (launch/engines/zygote_host.py) instead."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared._gone:
            host = FORK_SERVER.read(os.environ)
            if host:
                _shared = ForkServer(zygote_environ(rank_environ)).connect(host)
            else:
                _shared = ForkServer(zygote_environ(rank_environ)).start()
        return _shared


@atexit.register
def _close_shared() -> None:
    if _shared is not None and _shared.pid is not None:
        _shared.close()


if hasattr(os, "register_at_fork"):
    def _forget_in_child() -> None:
        global _shared
        _shared = None          # a forked copy of the launcher is not the zygote's launcher
    os.register_at_fork(after_in_child=_forget_in_child)
