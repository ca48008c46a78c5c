"""ServerLinks' interface over a server inside this process: no sockets, no encoding.

A script run with no cluster around (plain ``python train.py``) trains against
one in-process ParameterServer. Going through a socket there would copy every
row and gradient twice and hand each request to another thread; here a request
is a direct call of the server's checks and handlers (``handle_local``), in the
caller's thread, when it is submitted.

A reply that must wait (a sync pull for a step that is not complete yet) is
answered when a later request completes that step, as the socket server's loop
would. Nothing else drives this server, so a ticket still waiting when it is
collected can never be answered: that is an error naming what it waits for.
"""
from __future__ import annotations

import itertools
import time
from typing import Sequence

import numpy as np

from ..errors import DeadlineExceeded, RemoteError
from ..transport.client import Requests, Ticket
from .parameter_server import ParameterServer
from .replies import Deferred, Reply

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
        self._waiting: list[tuple[Ticket, int, int, str, Deferred]] = []

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
        self._answer_waiting()
        return ticket

    def collect(self, ticket: Ticket) -> list:
        if ticket.error is None and ticket.pending:
            waits = [w for w in self._waiting if w[0] is ticket]
            self.discard(ticket)
            reason = "; ".join(w[4].describe() for w in waits) or "its reply was discarded"
            raise DeadlineExceeded(f"{self.who}: {self.server.name} (in this process) cannot answer "
                                   f"{[w[3] for w in waits]}: {reason}; nothing else in this process can "
                                   f"complete it (a sync step needs every trainer of the job)")
        self.discard(ticket)
        if ticket.error is not None:
            raise ticket.error
        return ticket.results

    def poll_replies(self) -> None:
        """Every reply is in as soon as its request is handled: nothing to take."""

    def discard(self, ticket: Ticket) -> None:
        self._waiting = [w for w in self._waiting if w[0] is not ticket]
        ticket.pending.clear()

    def close(self) -> None:
        self._waiting = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- handling ------------------------------------------------------------
    def _handle(self, ticket: Ticket, request_id: int, header: dict, arrays: list) -> None:
        op = header.get("op")
        try:
            outcome = self.server.handle_local(header, arrays)
        except Exception as exc:   # noqa: BLE001 - the same error reply a remote server would send
            self._fail(ticket, request_id, op, exc)
            return
        if isinstance(outcome, Deferred):
            self._waiting.append((ticket, request_id, ticket.pending[request_id][0], op, outcome))
        else:
            self._answer(ticket, request_id, outcome)

    def _answer(self, ticket: Ticket, request_id: int, reply: Reply) -> None:
        slot, _, _ = ticket.pending.pop(request_id)
        ticket.results[slot] = ({"ok": True, **reply.fields}, [_own_copy(a) for a in reply.arrays])

    def _fail(self, ticket: Ticket, request_id: int, op: str, exc: Exception) -> None:
        code, message = self.server.failure_reply(op, exc)
        ticket.pending.pop(request_id, None)
        if ticket.error is None:
            ticket.error = RemoteError(self.server.name, code, message)

    def _answer_waiting(self) -> None:
        """Answer the waiting requests whose condition now holds, oldest first."""
        still = []
        for entry in self._waiting:
            ticket, request_id, _, op, deferred = entry
            try:
                if not deferred.ready():
                    still.append(entry)
                    continue
                self._answer(ticket, request_id, deferred.make_reply())
            except Exception as exc:   # noqa: BLE001 - a deferred reply may fail like any other
                self._fail(ticket, request_id, op, exc)
        self._waiting = still
