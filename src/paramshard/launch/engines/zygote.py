"""The fork server's own process (`paramshard launch --fork`); launch/engines/fork_server.py is the
launcher's side and says why it exists.

    python -m paramshard.launch.engines.zygote FD [MODULE ...]     (the modules to import; default FIRST, LATER)

FD is one end of a SOCK_SEQPACKET socket pair: one JSON object per packet, no pickle.

    launcher -> zygote   {"op": "fork", "id": N, "argv": [...], "env": {...}, "cwd": "...",
                          "all_imports": B}     false: fork now (a server), true: after LATER
                         + SCM_RIGHTS: [stdout] or [stdout, stderr] (the rank's output pipe)
                         {"op": "reap", "pid": P}       the launcher has its exit status
    zygote -> launcher   {"ready": true, "pid": P, "threads": [names]}   FIRST imported
                         {"forked": N, "pid": P}  or  {"forked": N, "error": "..."}
                         {"exited": P, "code": C}       C as Popen's returncode

It imports what ranks import (FIRST, LATER), then only waits: it starts no thread, socket
or torch op, so a fork copies one thread in a quiet state. A child it reports exited
stays a zombie until the launcher says "reap": until then its pid (and process group)
cannot be reused, so the launcher may signal the group without racing the reuse.
When the launcher's end closes (it exited or died), every child's group is SIGKILLed;
each child also has PR_SET_PDEATHSIG, so it dies with the zygote however that goes.
"""
from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

# What a server (`python -m paramshard server`) imports at start (FIRST), then what a trainer
# script does and what servers load when they first need it (LATER). The zygote reports ready
# after FIRST and imports LATER one module at a time between requests: servers are forked at
# once, a trainer waits for LATER. A module that is missing is skipped (its importer will say so
# in the rank, as it would unforked).
FIRST = ("numpy", "zmq", "paramshard", "paramshard.runtime", "paramshard.cli.main", "paramshard.cli.jobs.server",
         "paramshard.server.core.parameter_server")
LATER = ("torch", "torch.nn", "torch.nn.functional", "torch.optim", "paramshard.trainer", "pandas", "numba",
         "paramshard.server.storage.kernels.row_kernels", "paramshard.server.storage.kernels.update_kernels",
         "paramshard.server.storage.kernels.tier_kernels")

_PR_SET_PDEATHSIG = 1
_MAX_PACKET = 1 << 22
# Python's own start-up state for these; the zygote changes none but SIGINT and SIGHUP,
# and a rank must start from what `python` would give it.
_RESET: dict[signal.Signals, Callable[[int, FrameType | None], Any] | int] = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL, signal.SIGHUP: signal.SIG_DFL,
          signal.SIGCHLD: signal.SIG_DFL, signal.SIGUSR1: signal.SIG_DFL, signal.SIGUSR2: signal.SIG_DFL}


def thread_names() -> list[str]:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return names


def preload(modules) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    # What was imported stays out of the collector's reach: a rank's collections would otherwise
    # write to (and so copy) every page of the zygote's objects.
    gc.freeze()


def _send(sock: socket.socket, message: dict) -> None:
    sock.sendall(json.dumps(message).encode())


def _exit_code(info) -> int:
    """waitid's result as Popen's returncode: the exit code, or minus the signal."""
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


class Zygote:
    def __init__(self, sock: socket.socket, later=()):
        self.sock = sock
        self.later = list(later)               # still to import, between requests
        self.pid = os.getpid()
        self.watching: dict[int, int] = {}     # pid -> pidfd, until its exit is reported
        self.zombies: set[int] = set()         # reported, not reaped yet (the launcher says when)

    def serve(self) -> list[str] | None:
        """Answer the launcher until it goes (None: the zygote exits), or return a forked
        child's argv (in the child: main() runs it)."""
        try:
            return self._serve()
        except (BrokenPipeError, ConnectionResetError):
            self.kill_all()                    # the launcher is gone
            return None

    def _serve(self) -> list[str] | None:
        poller = select.poll()                 # poll, not epoll: no descriptor a child would inherit
        poller.register(self.sock, select.POLLIN)
        while True:
            events = poller.poll(0 if self.later else None)
            if not events and self.later:
                preload([self.later.pop(0)])
                continue
            for fd, _ in events:
                if fd != self.sock.fileno():
                    pid = next(p for p, f in self.watching.items() if f == fd)
                    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                    if info is None:
                        continue
                    poller.unregister(fd)
                    os.close(self.watching.pop(pid))
                    self.zombies.add(pid)
                    _send(self.sock, {"exited": pid, "code": _exit_code(info)})
                    continue
                data, fds, _, _ = socket.recv_fds(self.sock, _MAX_PACKET, 4)
                if not data:
                    self.kill_all()
                    return None
                message = json.loads(data)
                if message["op"] == "reap":
                    pid = message["pid"]
                    if pid in self.zombies:
                        self.zombies.discard(pid)
                        os.waitpid(pid, 0)
                    continue
                argv = self.fork(message, fds, poller)
                if argv is not None:
                    return argv

    def fork(self, message: dict, fds: list[int], poller) -> list[str] | None:
        if message.get("all_imports", True) and self.later:
            preload(self.later)
            self.later = []
        sys.stdout.flush()
        sys.stderr.flush()
        threads = thread_names()
        try:
            if len(threads) > 1:
                # A fork copies only the forking thread: a lock another one holds stays held for ever.
                raise OSError(f"the fork server has {len(threads)} threads ({', '.join(threads)}) after its imports")
            pid = os.fork()
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            _send(self.sock, {"forked": message["id"], "error": f"fork failed: {exc}"})
            return None
        if pid == 0:
            try:
                self.become_rank(message, fds)
            except BaseException as exc:       # noqa: BLE001 - the child must never return to the loop
                os.write(2, f"paramshard fork server: cannot start the rank: {exc!r}\n".encode())
                os._exit(127)
            return message["argv"]
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.watching[pid] = pidfd
        poller.register(pidfd, select.POLLIN)
        _send(self.sock, {"forked": message["id"], "pid": pid})
        return None

    def become_rank(self, message: dict, fds: list[int]) -> None:
        """In the child: what Popen(start_new_session=True, stdin=DEVNULL, stdout=, stderr=,
        env=, cwd=) and the parent-death guard (processes.py) give a rank started unforked."""
        os.setsid()
        if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            os.write(2, b"paramshard: prctl(PR_SET_PDEATHSIG) failed; this rank may outlive its launcher\n")
        if os.getppid() != self.pid:
            os._exit(128 + int(signal.SIGKILL))     # the zygote died already: the signal will never come
        self.sock.close()
        for fd in self.watching.values():
            os.close(fd)
        out, err = fds[0], fds[-1]
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in {null, *fds} - {0, 1, 2}:
            os.close(fd)
        for sig, handler in _RESET.items():
            signal.signal(sig, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        os.chdir(message["cwd"])
        os.environ.clear()                      # unsetenv, then setenv: libc's copies, all malloc'ed
        os.environ.update(message["env"])
        _show_environ(message["env"])
        _fresh_process_state()

    def kill_all(self) -> None:
        """The launcher is gone: no rank may outlive it."""
        for pid in [*self.watching, *self.zombies]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in [*self.watching, *self.zombies]:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


ENV_ROOM = "PSFORK_ENV_ROOM"      # the zygote's padding, see _show_environ


def _show_environ(environ: dict[str, str]) -> None:
    """Make /proc/PID/environ (`ps e`, tools and tests that find a rank by its variables) show
    the rank's environment, not the zygote's. The kernel shows the block the process was
    exec'd with, which a fork inherits: overwrite that block in place. Safe once os.environ has
    been replaced (no pointer of libc's environ still points into the block); possible when the
    new environment fits, which the zygote's padding variable (ENV_ROOM) is there for."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        start, end = int(fields[47]), int(fields[48])    # env_start, env_end (fields 50, 51)
    except (OSError, IndexError, ValueError):
        return
    data = b"".join(f"{k}={v}".encode() + b"\0" for k, v in environ.items())
    if start and len(data) <= end - start:
        ctypes.memmove(start, data + b"\0" * (end - start - len(data)), end - start)


def _fresh_process_state() -> None:
    """What differs between a forked rank and a new interpreter, set as the new one would
    have it: torch's (and MKL's) thread pool size was read from the zygote's environment,
    numpy's global generator was seeded once in the zygote (Python's `random` reseeds
    itself after a fork)."""
    from paramshard.settings.process_variables import OMP_THREADS
    threads = OMP_THREADS.read(os.environ) or ""
    if threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def run_rank(argv: list[str]) -> None:
    """Run the rank as `python -m MODULE ARGS` or `python SCRIPT ARGS` would: in a fresh
    ``__main__``, with its sys.argv and sys.path[0]. Exceptions and SystemExit propagate:
    the interpreter ends the process as it ends a rank started unforked."""
    import builtins
    import runpy
    import types
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    words = argv[1:]
    if words[0] == "-m":
        sys.argv = [words[1], *words[2:]]
        sys.path[0] = os.getcwd()
        # What `python -m` itself calls; private to CPython, so typeshed does not declare it.
        runpy._run_module_as_main(words[1], alter_argv=True)   # type: ignore[attr-defined]
        return
    script = words[0]
    sys.argv = list(words)
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    with open(script, "rb") as f:
        code = compile(f.read(), script, "exec")
    main.__file__, main.__spec__ = script, None
    main.__dict__["__cached__"] = None
    exec(code, main.__dict__)


def _own_frames_dropped(tb):
    """A traceback from the rank's code on: this module's frames are not the rank's."""
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


def _system_exit_code(exc: SystemExit) -> int:
    """What the interpreter makes of an uncaught SystemExit."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def finish(argv: list[str]):
    """Run the rank, then end the process as the interpreter would (a traceback and code 1 for an
    uncaught exception, death by SIGINT for KeyboardInterrupt, SystemExit's code), except for its
    teardown of every module: in a fork that writes to every page of the zygote's heap it touches
    (0.8 s of CPU a rank, measured), so after the non-daemon threads end, the atexit handlers run
    and stdout and stderr are flushed, the process exits (os._exit). Objects are not finalized:
    a file the rank left open and unflushed is not flushed (close it, or use `with`)."""
    import atexit
    import threading
    code, interrupted = 0, False
    try:
        run_rank(argv)
    except SystemExit as exc:
        code = _system_exit_code(exc)
    except BaseException as exc:      # noqa: BLE001 - reported as the interpreter reports it
        exc.__traceback__ = _own_frames_dropped(exc.__traceback__)    # the printer reads this one
        # Where the interpreter puts an uncaught exception before the atexit handlers run: a
        # Trainer left open reads it to tell the servers of a death, not a leave.
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
        if sys.version_info >= (3, 12):
            sys.last_exc = exc
        sys.excepthook(type(exc), exc, exc.__traceback__)
        code, interrupted = 1, isinstance(exc, KeyboardInterrupt)
    try:
        # What the interpreter does first at exit: wait for non-daemon threads (private to CPython,
        # so typeshed does not declare it).
        threading._shutdown()         # type: ignore[attr-defined]
    except BaseException:             # noqa: BLE001 - e.g. Ctrl-C while waiting: exit all the same
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    # Ctrl-C and hang-ups are the launcher's to handle; the zygote ends when its socket closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    preload(sys.argv[2:] or FIRST)
    _send(sock, {"ready": True, "pid": os.getpid(), "threads": thread_names()})
    argv = Zygote(sock, () if sys.argv[2:] else LATER).serve()
    if argv is None:
        os._exit(0)                 # nothing of the zygote's to finalize: its children are gone
    del sock
    finish(argv)


if __name__ == "__main__":
    main()
