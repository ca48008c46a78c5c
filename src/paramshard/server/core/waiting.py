"""The one list of deferred answers, for the socket loop and the in-process path alike.

A handler that cannot answer yet returns a ``Deferred`` (server/core/replies.py); the
request then waits here with a way to answer it (an ``Answer``: a reply on the
socket, or a ticket filled in the caller's process). Each pass answers what is
ready, fails at once what waits on a trainer that lost its connection, and gives
up on what outlived its deadline, each with an error naming what it waited for.
A reset voids everything that waits (``fail_all``).
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Callable, MutableMapping, Protocol

from paramshard.log import get_logger
from paramshard.server.core.barrier import Membership
from paramshard.server.core.replies import Deferred, Reply

log = get_logger("server")


class Answer(Protocol):
    """Where the answer to one waiting request goes."""

    def reply(self, reply: Reply) -> None:
        """The request succeeded."""

    def error(self, code: str, message: str) -> None:
        """An error reply with this code and message."""

    def failure(self, op: str, exc: Exception) -> None:
        """Building the reply raised ``exc``: the error reply the server gives any failed request."""


class Waiting:
    __slots__ = ("answer", "op", "deferred", "since", "deadline")

    def __init__(self, answer: Answer, op: str, deferred: Deferred, since: float, deadline: float):
        self.answer, self.op, self.deferred = answer, op, deferred
        self.since, self.deadline = since, deadline


class WaitingList:
    def __init__(self, name: str, membership: Membership, timeout: float,
                 stats: MutableMapping[str, float] | None = None, clock: Callable[[], float] = time.monotonic):
        self.name, self.membership, self.timeout = name, membership, timeout
        self.stats: MutableMapping[str, float] = stats if stats is not None else defaultdict(int)
        self._clock = clock
        self._entries: list[Waiting] = []

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self):
        return iter(list(self._entries))

    def add(self, answer: Answer, op: str, deferred: Deferred, timeout: float | None = None) -> None:
        """Wait for ``deferred``; ``timeout`` (default: the server's) may be ``math.inf``: the
        in-process path, where the caller itself says when it stops waiting."""
        now = self._clock()
        wait = self.timeout if timeout is None else timeout
        self._entries.append(Waiting(answer, op, deferred, now, now + wait if math.isfinite(wait) else math.inf))

    def soonest_deadline(self) -> float | None:
        return min((w.deadline for w in self._entries), default=None)

    def answer_ready(self) -> None:
        """One pass, oldest first: answer, fail or keep each waiting request."""
        if not self._entries:
            return
        now = self._clock()
        still = []
        for w in self._entries:
            try:
                if w.deferred.ready():
                    w.answer.reply(w.deferred.make_reply())
                    # How long requests queue behind a barrier or a bound (the run directory's queue_s).
                    self.stats["deferred_answered"] += 1
                    self.stats["deferred_wait_s"] += now - w.since
                    continue
                lost = self._lost_peers(w.deferred)
                if lost:
                    w.answer.error("peer_lost", f"{self.name} cannot finish {w.op}: trainers {lost} lost their "
                                                f"connection without leaving (died?){self.membership.where(lost)}; "
                                                f"{w.deferred.describe()}")
                elif now >= w.deadline:
                    self.stats["timeouts"] += 1
                    msg = f"{self.name} gave up on {w.op} after {self.timeout:g} s: {w.deferred.describe()}"
                    log.warning(msg)
                    w.answer.error("timeout", msg)
                else:
                    still.append(w)
            except Exception as exc:   # noqa: BLE001 - a deferred reply may fail like any other
                w.answer.failure(w.op, exc)
        # Answers run no request, so nothing was added meanwhile; keep the order of arrival.
        self._entries = still

    def _lost_peers(self, deferred: Deferred) -> list[int]:
        failed = self.membership.failed
        if not failed or deferred.waits_on is None:
            return []
        return sorted(set(deferred.waits_on()) & failed)

    def fail_all(self, code: str, message: str) -> None:
        """Answer every waiting request with an error (a reset voids them)."""
        entries, self._entries = self._entries, []
        for w in entries:
            w.answer.error(code, f"{message}; this {w.op} is void")

    def remove_where(self, doomed: Callable[[Waiting], bool]) -> list[Waiting]:
        """Forget the waits ``doomed`` picks (a caller that stopped waiting); returns them."""
        gone = [w for w in self._entries if doomed(w)]
        self._entries = [w for w in self._entries if not doomed(w)]
        return gone
