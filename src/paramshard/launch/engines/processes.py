"""Child processes of a launcher: spawn with a tagged log pump, stop with escalation,
and never outlive the launcher.

Every child leads a process group of its own, so stopping it signals the whole
group (its own children, e.g. DataLoader workers, included). A launcher that
is SIGKILLed (or crashes, or is OOM-killed) cannot stop anything, so two
things outlive it on its behalf:

* each child is started through a few lines of Python that set
  PR_SET_PDEATHSIG (Linux) before exec'ing the real command, so the kernel
  SIGKILLs the child when the launcher goes. The kernel sends it only to that
  process, not to what it has started itself, and it fires when the *thread*
  that forked exits, so it is set only for children spawned from the main
  thread (which lives as long as the process);
* one small guardian process per launcher reads a pipe from the launcher;
  the launcher writes the process group of each live child into it. When the
  launcher dies, however it dies, the pipe reaches EOF and the guardian
  SIGKILLs every group still listed: grandchildren included, unless they made
  a session or group of their own (setsid), which nothing here can follow.
  A group is taken off the list as soon as the launcher sees its leader exit,
  so the guardian never signals a process-group id the kernel may have reused.
  Left for later: the trainer runtime could also watch its parent pid itself.
"""
from __future__ import annotations

import atexit
import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Iterable, Sequence, TextIO

from paramshard.messages.status_lines import STATUS_MARK, PeerStatus

_print_lock = threading.Lock()

# The final line of a traceback ("RuntimeError: boom", "paramshard.errors.RemoteError: ...",
# "KeyboardInterrupt"), as opposed to its frames, which are indented.
ERROR_LINE = re.compile(r"^(?:\w+\.)*\w*(?:Error|Exception|Interrupt|Exit)(?::|$)")
TRACEBACK_STARTS = ("Traceback (most recent call last):", "During handling of the above exception",
                    "The above exception was the direct cause")
_LOG_RECORD = re.compile(r"^\d\d:\d\d:\d\d ")     # a new log line (log.py's format), not a message's tail
RECENT_LINES = 40


def error_excerpt(lines: Sequence[str], context: int = 4, tail: int = 5) -> list[str]:
    """The lines that say why a process failed: its last exception line with up to
    ``context`` lines of its traceback before it (and a multi-line message's rest),
    else its last ``tail`` non-empty lines."""
    lines = list(lines)
    tracebacks = [i for i, line in enumerate(lines) if line.startswith(TRACEBACK_STARTS)]
    found = next((i for i in reversed(range(len(lines))) if ERROR_LINE.match(lines[i])), None)
    if tracebacks and (found is None or found < tracebacks[-1]):
        # An exception whose name does not say so: the first unindented line after the traceback.
        found = next((i for i in range(tracebacks[-1] + 1, len(lines))
                      if lines[i] and not lines[i][0].isspace()), found)
    if found is None:
        return [line for line in lines if line.strip()][-tail:]
    header = max((i for i in tracebacks if i < found), default=None)
    start = max(found - context, header) if header is not None else found
    end = found + 1
    while (end < len(lines) and end - found <= tail and lines[end].strip()
           and not lines[end].startswith(TRACEBACK_STARTS) and not _LOG_RECORD.match(lines[end])):
        end += 1
    return lines[start:end]


PDEATH_SIGNAL = signal.SIGKILL
_PR_SET_PDEATHSIG = 1
_LINUX = sys.platform.startswith("linux")

# argv: <expected parent pid> <command...>. Runs with -I -S: stdlib only, a few ms.
_GUARD = f"""\
# paramshard: parent-death guard, then exec
import ctypes, os, sys
parent = int(sys.argv[1])
if ctypes.CDLL(None, use_errno=True).prctl({_PR_SET_PDEATHSIG}, {int(PDEATH_SIGNAL)}, 0, 0, 0) != 0:
    sys.stderr.write("paramshard: prctl(PR_SET_PDEATHSIG) failed; this process may outlive its launcher\\n")
if os.getppid() != parent:
    # The launcher died before prctl ran: the parent-death signal will never come.
    os._exit(128 + {int(PDEATH_SIGNAL)})
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    sys.stderr.write(f"paramshard: cannot run {{sys.argv[2]}}: {{exc}}\\n")
    os._exit(127)
"""

# stdin: lines "+<pgid>" (watch) and "-<pgid>" (forget). EOF: the launcher is gone.
_GUARDIAN = f"""\
# paramshard: guardian of a launcher's children
import os, signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
groups, pending = set(), b""
while True:
    try:
        data = os.read(0, 4096)
    except InterruptedError:
        continue
    if not data:
        break
    *lines, pending = (pending + data).split(b"\\n")
    for line in lines:
        if line[:1] == b"+":
            groups.add(int(line[1:]))
        elif line[:1] == b"-":
            groups.discard(int(line[1:]))
for pgid in groups:
    try:
        os.killpg(pgid, {int(signal.SIGKILL)})
    except OSError:
        pass
"""


def guarded_argv(argv: Sequence[str], parent_pid: int | None = None) -> list[str]:
    """``argv`` behind the parent-death guard: the process is SIGKILLed when ``parent_pid`` exits."""
    parent = os.getpid() if parent_pid is None else parent_pid
    return [sys.executable, "-I", "-S", "-c", _GUARD, str(parent), *argv]


class _Guardian:
    """The launcher side of the guardian process (see the module docstring)."""

    def __init__(self):
        self._reset()

    def _reset(self) -> None:
        """As new: also a forked copy's start (_after_fork)."""
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._proc: subprocess.Popen | None = None
        self._owner = 0
        self._failed = False

    def _ensure(self) -> int | None:
        """The pipe to this process's guardian, started on first use; None: there is none."""
        if self._fd is not None and self._owner == os.getpid():
            return self._fd
        if self._failed:
            return None
        read_end, write_end = os.pipe()          # both non-inheritable (PEP 446)
        try:
            self._proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _GUARDIAN], stdin=read_end,
                                          stdout=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            os.close(write_end)
            self._failed = True
            sys.stderr.write(f"paramshard: cannot start the guardian process ({exc}); children rely on "
                             f"their parent-death signal alone\n")
            return None
        finally:
            os.close(read_end)
        self._fd, self._owner = write_end, os.getpid()
        return write_end

    def _send(self, line: str) -> None:
        with self._lock:
            fd = self._ensure()
            if fd is None:
                return
            try:
                os.write(fd, line.encode())
            except OSError:
                pass                                  # guardian gone; parent-death signals still apply

    def watch(self, pgid: int) -> None:
        self._send(f"+{pgid}\n")

    def forget(self, pgid: int) -> None:
        if self._fd is not None:
            self._send(f"-{pgid}\n")

    def close(self, timeout: float = 2.0) -> None:
        """Normal exit: EOF (every group still listed is killed), then reap the guardian."""
        with self._lock:
            if self._fd is None or self._owner != os.getpid():
                return
            os.close(self._fd)
            self._fd = None
            assert self._proc is not None       # started with the pipe (_ensure)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass

    def _after_fork(self) -> None:
        # A forked copy of the launcher must not hold the pipe open (the guardian
        # would wait for it too) nor write into the launcher's list.
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._reset()


_guardian = _Guardian()
atexit.register(_guardian.close)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_guardian._after_fork)


class _GroupPopen(subprocess.Popen):
    """A Popen that signals its process group (the child leads one: start_new_session)."""

    def killpg(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass


class Child:
    """One process whose merged stdout/stderr lines are printed as ``tag | line``."""

    def __init__(self, tag: str, argv: Sequence[str], env: dict, out: TextIO | None = None,
                 stdin_text: str | None = None, tap=None, spawn=None):
        """``stdin_text``: when given, the child's stdin is a pipe that gets this text
        and then stays open for the child's lifetime (an ssh channel whose remote
        side kills its processes when stdin closes, i.e. when this launcher goes).
        ``tap(line) -> bool``: sees every line first (the run directory's log file, metric
        records); a line it returns True for is taken out of the output.
        ``spawn() -> process``: starts it instead of Popen (``--fork``: launch/engines/fork_server.py's
        ForkedProc, which has what is used here of a Popen, and ``killpg``)."""
        self.tag, self.argv, self.tap = tag, list(argv), tap
        self.out = out or sys.stdout
        # Its last lines, timed, for the launcher's failure summary (error_excerpt).
        self._recent: collections.deque[tuple[float, str]] = collections.deque(maxlen=RECENT_LINES)
        self._recent_lock = threading.Lock()
        self._exit_seen: float | None = None       # when poll() first saw it exit
        self._eof_at: float | None = None          # when its output ended
        self._hold_tracebacks = False              # see hold_tracebacks()
        self._in_traceback = False
        self.withheld: list[str] = []              # exception lines of the tracebacks not copied
        self._muted = False
        # Its last status line (messages/status_lines.py) and when it came: servers under a launcher.
        self.status: PeerStatus | None = None
        self.status_at: float | None = None
        # PR_SET_PDEATHSIG fires when the forking thread exits: only the main
        # thread lives as long as the launcher. Other threads rely on the guardian.
        on_main = threading.current_thread() is threading.main_thread()
        command = guarded_argv(self.argv) if _LINUX and on_main else self.argv
        # A session of its own: Ctrl-C reaches the launcher, which stops the
        # children in order, instead of every process dying half-way at once.
        self.proc = spawn() if spawn is not None else _GroupPopen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL if stdin_text is None else subprocess.PIPE,
            start_new_session=True, text=True, errors="replace", bufsize=1)
        if stdin_text:
            stdin = self.proc.stdin
            assert stdin is not None        # a pipe: Popen above (never spawn: ssh's ranks are not forked)
            try:
                stdin.write(stdin_text)
                stdin.flush()
            except OSError:
                pass          # it already exited: poll() will say how
        self._watched = True
        _guardian.watch(self.proc.pid)
        self._pump = threading.Thread(target=self._copy_lines, name=f"log-{tag}", daemon=True)
        self._pump.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _copy_lines(self) -> None:
        writable = True
        stdout = self.proc.stdout
        assert stdout is not None           # a pipe (Popen above), or ForkedProc's
        for line in stdout:
            if line.startswith(STATUS_MARK):
                # For the launcher only: neither printed nor written to the run directory.
                status = PeerStatus.parse(line)
                if status is not None:
                    with self._recent_lock:
                        self.status, self.status_at = status, time.monotonic()
                continue
            if self.tap is not None and self.tap(line):
                continue
            with self._recent_lock:
                self._recent.append((time.monotonic(), line.rstrip("\n")))
            if self._hold_tracebacks and self._withhold(line.rstrip("\n")):
                continue
            if not writable or self._muted:
                continue                 # keep draining, so the child never blocks on a full pipe
            try:
                with _print_lock:
                    self.out.write(f"{self.tag} | {line}" if line.endswith("\n") else f"{self.tag} | {line}\n")
                    self.out.flush()
            except (OSError, ValueError):
                writable = False         # e.g. the terminal went away (SIGHUP)
        self._eof_at = time.monotonic()

    def _withhold(self, line: str) -> bool:
        """While holding tracebacks: True for the lines of a traceback (its exception
        line is kept in ``withheld``) and for blank lines."""
        if line.startswith(TRACEBACK_STARTS):
            self._in_traceback = True
            return True
        if self._in_traceback:
            if not line or line[0].isspace():
                return True
            self._in_traceback = False
            self.withheld.append(line)
            return True
        return not line.strip()

    def hold_tracebacks(self) -> None:
        """Stop copying tracebacks (and blank lines) from now on: the launcher is stopping
        this process, and what it prints as it dies (KeyboardInterrupt, a peer lost) is noise."""
        self._hold_tracebacks = True

    def mute(self) -> None:
        """Copy nothing more (the output is still drained and kept in ``recent_lines``)."""
        self._muted = True

    def recent_lines(self) -> list[tuple[float, str]]:
        """Its last lines (up to RECENT_LINES) as (time.monotonic() when read, text)."""
        with self._recent_lock:
            return list(self._recent)

    def error_excerpt(self) -> list[str]:
        return error_excerpt([line for _, line in self.recent_lines()])

    @property
    def ended_at(self) -> float | None:
        """When it exited, as well as the launcher can tell (time.monotonic())."""
        times = [t for t in (self._exit_seen, self._eof_at) if t is not None]
        return min(times) if self.proc.returncode is not None and times else None

    def failed_at(self) -> float | None:
        """When it reported its error (an exception line among its last lines), else when it exited."""
        for t, line in reversed(self.recent_lines()[-10:]):
            if ERROR_LINE.match(line):
                return t
        return self.ended_at

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None:
            if self._exit_seen is None:
                self._exit_seen = time.monotonic()
            self._forget()
        return code

    def _forget(self) -> None:
        if self._watched:
            self._watched = False
            _guardian.forget(self.proc.pid)

    def describe_exit(self) -> str:
        code = self.proc.returncode
        if code is None:
            return f"{self.tag} (pid {self.pid}) is still running"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"{self.tag} (pid {self.pid}) was killed by {name}"
        return f"{self.tag} (pid {self.pid}) exited with code {code}"

    def last_status(self) -> tuple[PeerStatus | None, float | None]:
        """(its last status line, time.monotonic() when it came), (None, None) before any."""
        with self._recent_lock:
            return self.status, self.status_at

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the child's process group, then SIGKILL if it lingers."""
        stop_all([self], grace)

    def kill(self, timeout: float = 5.0) -> None:
        """SIGKILL the child's process group at once and reap it (a hung child: SIGTERM
        would wait for a process that runs no handler, SIGKILL works even on a stopped one)."""
        self._signal(signal.SIGKILL)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass                         # uninterruptible sleep: poll() says when it is gone
        self.poll()

    def _signal(self, sig: int) -> None:
        self.proc.killpg(sig)


def stop_all(children: Iterable[Child], grace: float = 5.0, hurry: threading.Event | None = None) -> None:
    """Stop children together: SIGTERM every group, one shared grace period, then SIGKILL.

    The time is bounded whatever the number of children (about grace + 7 s at
    worst); setting ``hurry`` (e.g. a second Ctrl-C) ends the grace period early.
    """
    children = list(children)
    running = [c for c in children if c.poll() is None]
    for c in running:
        c._signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while (running := [c for c in running if c.poll() is None]) and time.monotonic() < deadline:
        if hurry is not None and hurry.is_set():
            break
        time.sleep(0.02)
    for c in running:
        c._signal(signal.SIGKILL)
    deadline = time.monotonic() + 5
    for c in running:
        try:
            c.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass                         # unkillable for now (uninterruptible sleep); nothing more to do
    deadline = time.monotonic() + 2
    for c in children:
        c.poll()
        c._pump.join(timeout=max(0.0, deadline - time.monotonic()))
        if not c._pump.is_alive() and c.proc.stdout is not None:      # a pipe: always (Child)
            c.proc.stdout.close()
        if c.proc.stdin is not None:
            try:
                c.proc.stdin.close()
            except OSError:
                pass


if TYPE_CHECKING:   # `make typecheck` checks the contract: Process (launch/engines/process.py)
    from paramshard.launch.engines.process import Process
    _process: type[Process] = Child
