"""What an engine hands back for each rank it starts, and what an engine is.

``Process`` declares every member the supervision loop (launch/supervision/launcher.py) and
the failure summary (launch/supervision/rank_exit.py) use: the loop calls them directly, it
never probes an object for what it might have. ``processes.Child`` (the local
engine) and ``ssh.RemoteChild`` (the SSH engine) implement all of it; an engine
whose processes cannot tell something answers with the neutral value (no status
line: ``(None, None)``, no lines kept: ``[]``, no time known: ``None``).
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol, Sequence, TypeVar

if TYPE_CHECKING:
    from paramshard.launch.api import RankSpec
    from paramshard.messages.status_lines import PeerStatus


class Process(Protocol):
    tag: str                 # "trainer 1", or "10.0.0.2 | trainer 1" when it runs on another host
    # Exception lines of the tracebacks not shown after ``hold_tracebacks`` (a stop's noise).
    withheld: list[str]

    @property
    def pid(self) -> int:
        """The local process id (for a remote rank: its ssh client's)."""

    def poll(self) -> int | None:
        """None while it runs, else its return code (negative: killed by that signal)."""

    def describe_exit(self) -> str:
        """One line for the log: who it is and how it ended."""

    def last_status(self) -> "tuple[PeerStatus | None, float | None]":
        """Its last status line (messages/status_lines.py) and time.monotonic() when it came."""

    def error_excerpt(self) -> list[str]:
        """The lines of its own output that say why it failed (processes.error_excerpt)."""

    def failed_at(self) -> float | None:
        """When it reported its error (time.monotonic()), else when it exited."""

    @property
    def ended_at(self) -> float | None:
        """When it exited, as well as the launcher can tell; None while it runs."""

    def hold_tracebacks(self) -> None:
        """Stop copying tracebacks: the launcher is stopping it, what it prints as it dies is noise."""

    def mute(self) -> None:
        """Copy nothing more of its output (the job's summary is the last word)."""

    def kill(self) -> None:
        """SIGKILL it at once (a hung process runs no SIGTERM handler)."""


# An engine stops only the processes it started: ``Engine[Child]`` (local, SSH) takes back Childs.
P = TypeVar("P", bound=Process)


class Engine(Protocol[P]):
    def start(self, rank: "RankSpec") -> P:
        """Start one rank; raise ConfigError naming the rank or host when that fails."""

    def stop(self, processes: Sequence[P], grace: float, hurry: threading.Event | None) -> None:
        """Stop these processes together: TERM, one shared grace period, then KILL."""

    def ask_to_leave(self, process: P) -> None:
        """Ask an elastic job's trainer to leave at its next step boundary (SIGUSR1 for it:
        trainer/leave_request.py); nothing if it has exited."""
