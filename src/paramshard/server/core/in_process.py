"""ServerLinks' interface over a server inside this process: no sockets, no encoding.

A script run with no cluster around (plain ``python train.py``) trains against
one in-process ParameterServer. Going through a socket there would copy every
row and gradient twice and hand each request to another thread; here a request
is a direct call of the server's checks and handlers (``handle_local``), in the
caller's thread, when it is submitted.

A reply that must wait (a sync pull for a step that is not complete yet) waits
on the server's one waiting list (server/core/waiting.py), as on the socket path, and
is answered when a later request completes that step. Nothing else drives this
server, so a ticket still waiting when it is collected can never be answered:
that is an error naming what it waits for (no deadline of its own meanwhile).
"""
from __future__ import annotations

import itertools
import math
import time
from typing import Sequence

import numpy as np

from paramshard.errors import DeadlineExceeded, RemoteError
from paramshard.transport.requests import Requests, Ticket
from paramshard.server.core.parameter_server import ParameterServer
from paramshard.server.core.replies import Reply

_ids = itertools.count(1)


def _own_copy(array: np.ndarray) -> np.ndarray:
    # A reply may be a view of the server's own arrays (dense values): the caller keeps
    # it while later requests change them, so it gets a copy. Fresh arrays pass as they are.
    return array if array.base is None and array.flags.owndata else array.copy()


class LocalLinks(Requests):
    """Requests to an in-process server, as ServerLinks makes them to remote ones."""

    def __init__(self, server: ParameterServer, timeout: float, who: str = "trainer"):
        self.server, self.timeout, self.who = server, timeout, who
        self.epoch = 0
        self.security = None

    def __len__(self) -> int:
        return 1

    def wait_ready(self, timeout: float = 30.0) -> list[dict]:
        return [self.request(0, {"op": "hello"})[0]]

    def submit(self, requests: Sequence[tuple], timeout: float | None = None) -> Ticket:
        wait = self.timeout if timeout is None else timeout
        ticket = Ticket(len(requests), wait, time.monotonic() + wait)
        for slot, (server, header, arrays) in enumerate(requests):
            if server != 0:
                raise ValueError(f"{self.who}: request for server {server}; the in-process job has server 0 only")
            request_id = next(_ids)
            ticket.pending[request_id] = (slot, 0, header.get("op"))
            self._handle(ticket, request_id, header, list(arrays))
        self.server.waiting.answer_ready()
        return ticket

    def collect(self, ticket: Ticket) -> list:
        if ticket.error is None and ticket.pending:
            waits = self._forget(ticket)
            reason = "; ".join(w.deferred.describe() for w in waits) or "its reply was discarded"
            raise DeadlineExceeded(f"{self.who}: {self.server.name} (in this process) cannot answer "
                                   f"{[w.op for w in waits]}: {reason}; nothing else in this process can "
                                   f"complete it (a sync step needs every trainer of the job)")
        self.discard(ticket)
        if ticket.error is not None:
            raise ticket.error
        return ticket.results

    def poll_replies(self) -> None:
        """Every reply is in as soon as its request is handled: nothing to take."""

    def discard(self, ticket: Ticket) -> None:
        self._forget(ticket)

    def _forget(self, ticket: Ticket) -> list:
        """Stop waiting for ``ticket``'s replies; the waits dropped."""
        ticket.pending.clear()
        return self.server.waiting.remove_where(lambda w: isinstance(w.answer, _TicketAnswer) and
                                                w.answer.ticket is ticket)

    def close(self) -> None:
        self.server.waiting.remove_where(lambda w: isinstance(w.answer, _TicketAnswer) and w.answer.links is self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- handling ------------------------------------------------------------
    def _handle(self, ticket: Ticket, request_id: int, header: dict, arrays: list) -> None:
        op = header.get("op", "?")      # "?": as the socket path names a request without one (refused)
        try:
            outcome = self.server.handle_local(header, arrays)
        except Exception as exc:   # noqa: BLE001 - the same error reply a remote server would send
            self._fail(ticket, request_id, op, exc)
            return
        if isinstance(outcome, Reply):
            self._answer(ticket, request_id, outcome)
        else:
            self.server.waiting.add(_TicketAnswer(self, ticket, request_id), op, outcome, timeout=math.inf)

    def _answer(self, ticket: Ticket, request_id: int, reply: Reply) -> None:
        slot, _, _ = ticket.pending.pop(request_id)
        ticket.results[slot] = ({"ok": True, **reply.fields}, [_own_copy(a) for a in reply.arrays])

    def _fail(self, ticket: Ticket, request_id: int, op: str, exc: Exception) -> None:
        code, message = self.server.failure_reply(op, exc)
        ticket.pending.pop(request_id, None)
        if ticket.error is None:
            ticket.error = RemoteError(self.server.name, code, message)


class _TicketAnswer:
    """The answer to a waiting in-process request fills its ticket (an Answer: server/core/waiting.py)."""
    __slots__ = ("links", "ticket", "request_id")

    def __init__(self, links: LocalLinks, ticket: Ticket, request_id: int):
        self.links, self.ticket, self.request_id = links, ticket, request_id

    def reply(self, reply: Reply) -> None:
        self.links._answer(self.ticket, self.request_id, reply)

    def error(self, code: str, message: str) -> None:
        self.ticket.pending.pop(self.request_id, None)
        if self.ticket.error is None:
            self.ticket.error = RemoteError(self.links.server.name, code, message)

    def failure(self, op: str, exc: Exception) -> None:
        self.links._fail(self.ticket, self.request_id, op, exc)
