"""How one rank ended, as data: what the supervision loop decides on and the summary prints.

A ``RankExit`` is read once from a ``Process`` (launch/engines/process.py) when the loop
sees it fail: its return code (a negative one is the signal that killed it), when
it reported its error, its own last lines, and whether it only failed because a
peer did. "Peer lost" comes from what the rank reports: a server says so by its
exit code (``PEER_LOST_EXIT_CODE``, after naming the peers in its status lines).
A trainer has no such channel yet, so for trainers the exception it ended with is
still read from its excerpt (``PEER_LOST_MARKERS``, the errors the client raises
for a lost server); that fallback lives here only.

``first_failure`` and ``failure_summary`` also take processes, even partial
ones (``RankExit.of_partial``: the summary's callers outside the loop).
"""
from __future__ import annotations

import dataclasses
import signal
from typing import Sequence, TypeVar

from paramshard.launch.engines.process import Process
from paramshard.messages.status_lines import PEER_LOST_EXIT_CODE

# The errors a trainer ends with when it failed because a server did (client/, transport/).
PEER_LOST_MARKERS = ("peer_lost", "lost its connection", "lost their connection", "ServerUnavailable")
SSH_FAILED = 255          # what ssh exits with when it cannot connect or loses the connection


def exit_status(code: int) -> int:
    """A process's return code as a shell would report it (128 + signal for a signal)."""
    return 128 - code if code < 0 else code


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _reported_peer_loss(name: str, code: int | None, excerpt: Sequence[str]) -> bool:
    if code == PEER_LOST_EXIT_CODE and name.startswith("server "):
        return True
    return any(m in line for line in excerpt for m in PEER_LOST_MARKERS)


@dataclasses.dataclass(frozen=True)
class RankExit:
    tag: str                            # "trainer 1", "10.0.0.2 | trainer 1"
    code: int | None                    # return code; negative: killed by that signal; None: running
    pid: int | None = None
    peer_lost: bool = False             # it failed because another rank did (see the module docstring)
    failed_at: float | None = None      # when it reported its error (time.monotonic())
    ended_at: float | None = None       # when it exited
    excerpt: tuple[str, ...] = ()       # its own lines saying why

    @classmethod
    def of(cls, p: Process) -> "RankExit":
        """Read from a process that implements the whole Process protocol (the loop's)."""
        return cls._read(p, p.error_excerpt, p.pid, p.failed_at, p.ended_at)

    @classmethod
    def brief(cls, p: Process) -> "RankExit":
        """Its code and where it ran only, for a log line (nothing of its output is read)."""
        return cls(p.tag, p.poll(), p.pid)

    @classmethod
    def of_partial(cls, p) -> "RankExit":
        """Read from an object with only part of the protocol (an engine outside this
        package, a test's fake): what it lacks, the summary does without."""
        return cls._read(p, getattr(p, "error_excerpt", list), getattr(p, "pid", None),
                         getattr(p, "failed_at", lambda: None), getattr(p, "ended_at", None))

    @classmethod
    def _read(cls, p, excerpt_of, pid, failed_at, ended_at) -> "RankExit":
        name = p.tag.rpartition(" | ")[2]
        excerpt = tuple(excerpt_of())
        code = p.poll()
        return cls(p.tag, code, pid, _reported_peer_loss(name, code, excerpt), failed_at(), ended_at, excerpt)

    @property
    def name(self) -> str:
        """'trainer 1' for a tag 'trainer 1' or '10.0.0.2 | trainer 1'."""
        return self.tag.rpartition(" | ")[2]

    @property
    def host(self) -> str | None:
        """The host it ran on when another one (over ssh); None: this machine."""
        return self.tag.rpartition(" | ")[0] or None

    @property
    def signal(self) -> int | None:
        return -self.code if self.code is not None and self.code < 0 else None

    @property
    def status(self) -> int:
        """Its exit status as a shell reports it (128 + signal); 1 if it says nothing."""
        return exit_status(self.code) if self.code is not None else 1

    @property
    def stopped(self) -> bool:
        """Ended by the launcher's own stop (SIGTERM, then SIGKILL)."""
        return self.code in (-signal.SIGTERM, -signal.SIGKILL)

    def reason(self) -> str:
        """'exit code 1', 'killed by SIGKILL', ..."""
        code = self.code
        if code is None:
            return "still running"
        if code < 0:
            return f"killed by {_signal_name(-code)}"
        if code == SSH_FAILED and self.host is not None:
            return "exit code 255: ssh failed or lost its connection"
        if 128 < code <= 128 + 64 and _signal_name(code - 128).startswith("SIG"):
            return f"exit code {code}, i.e. 128 + {_signal_name(code - 128)}?"
        return f"exit code {code}"

    def where(self) -> str:
        if self.host:
            return f"on {self.host}"
        return f"pid {self.pid} on this machine" if self.pid is not None else "on this machine"


P = TypeVar("P")


def _exit(p) -> RankExit:
    return p if isinstance(p, RankExit) else RankExit.of_partial(p)


def lost_a_peer(p: Process | RankExit) -> bool:
    return _exit(p).peer_lost


def first_failure(failed: Sequence[P]) -> P:
    """The root cause among ranks seen failed together: one that did not just lose a
    peer, the earliest to report its error (list order when nothing tells)."""
    exits = [_exit(p) for p in failed]

    def key(i: int):
        e = exits[i]
        return e.peer_lost, e.failed_at if e.failed_at is not None else float("inf"), i
    return failed[min(range(len(failed)), key=key)]


def failure_summary(first, others: Sequence, stopped: Sequence = (), max_others: int = 8,
                    why: str | None = None) -> str:
    """The block a failed job ends with: the first failure, its own error, and the
    ranks that failed after it (marked when they only lost a peer); ``stopped``:
    those of them the launcher had to stop after they reported their error; ``why``:
    the launcher's own finding about the first (a hung server it killed). Ranks are
    RankExits or processes."""
    head = _exit(first)
    stopped_tags = {_exit(p).tag for p in stopped}
    if why:
        lines = [f"first failure: {head.name} ({why}; the launcher killed it: {head.reason()}; {head.where()})"]
    else:
        lines = [f"first failure: {head.name} ({head.reason()}; {head.where()})"]
    lines += [f"    {line}" for line in head.excerpt] if head.excerpt else ["    (it printed nothing)"]
    for e in map(_exit, others[:max_others]):
        reason = "then stopped by the launcher" if e.tag in stopped_tags else e.reason()
        if e.peer_lost:
            lines.append(f"  {e.tag}: failed after {head.name} (peer lost; {reason})")
        else:
            lines.append(f"  {e.tag}: failed after {head.name} ({reason})" + (f": {e.excerpt[-1]}" if e.excerpt else ""))
    if len(others) > max_others:
        lines.append(f"  ... and {len(others) - max_others} more failed after {head.name}")
    return "\n".join(lines)
