"""What a client of the servers is asked for, over sockets or in-process alike: ``Requests``
(submit a fan-out of requests, collect their replies under one deadline, and the blocking calls
built on those), the ``Ticket`` of one fan-out, and the retry policy bounded-loss recovery plugs
in (transport/links.py: ServerLinks; server/core/in_process.py: LocalLinks).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np

from paramshard.transport.busy import BusyRequests

if TYPE_CHECKING:
    from paramshard.transport.links import ServerLinks


class Ticket:
    """Requests sent together by ``ServerLinks.submit``, awaiting their replies."""
    __slots__ = ("results", "pending", "error", "wait", "deadline", "losses", "retry", "sent", "resend", "replayed",
                 "moved", "busy")

    def __init__(self, count: int, wait: float, deadline: float):
        self.results: list = [None] * count
        self.pending: dict[int, tuple[int, int, str]] = {}     # request id -> (slot, server, op)
        self.error: Exception | None = None
        self.wait, self.deadline = wait, deadline
        self.losses: dict[int, int] = {}     # server -> its link's lost connections when sent
        # With a retry policy (bounded-loss recovery): what each request was, to send it again.
        self.retry = False
        self.sent: dict[int, tuple] = {}     # request id -> (server, header, arrays)
        self.resend: dict[int, Exception] = {}   # server -> why its requests go again
        self.replayed: set[int] = set()      # request ids that are resent ones
        self.moved: list[int] = []           # slots refused with ``moved`` (their result stays None)
        self.busy = BusyRequests()           # refused as busy: sent again after a backoff (transport/busy.py)

    @property
    def done(self) -> bool:
        """Every reply is in (or an error is): ``collect`` will not wait."""
        return not self.pending or self.error is not None


class RetryPolicy(Protocol):
    """What ServerLinks asks of its retry policy (bounded-loss recovery: client/recovery.ServeAgain)."""
    codes: tuple[str, ...]      # error codes of a server that will serve again (its requests wait)

    def wait_serving(self, links: "ServerLinks", server: int, cause: Exception) -> None:
        """Return once ``server`` serves again; raise (naming it) past the deadline."""


class Requests:
    """The blocking calls, built on ``submit`` and ``collect`` (ServerLinks, LocalLinks)."""
    epoch: int      # the job's epoch, carried by data requests (client/recovery.py)

    def __len__(self) -> int:
        """How many server indices there are (retired ones too)."""
        raise NotImplementedError

    def submit(self, requests: Sequence[tuple], timeout: float | None = None) -> Ticket:
        """Send [(server, header, arrays)]; the replies come from ``collect``."""
        raise NotImplementedError

    def collect(self, ticket: Ticket) -> list:
        """The replies of ``ticket``, in request order."""
        raise NotImplementedError

    def discard(self, ticket: Ticket) -> None:
        """Forget ``ticket``: its replies are not awaited any more."""
        raise NotImplementedError

    def request(self, server: int, header: dict, arrays: Sequence[np.ndarray] = (),
                timeout: float | None = None):
        return self.request_list([(server, header, arrays)], timeout)[0]

    def request_many(self, requests: dict, timeout: float | None = None) -> dict:
        """{server: (header, arrays)} -> {server: (reply_header, reply_arrays)}."""
        servers = list(requests)
        replies = self.request_list([(s, *requests[s]) for s in servers], timeout)
        return dict(zip(servers, replies))

    def request_list(self, requests: Sequence[tuple], timeout: float | None = None) -> list:
        """[(server, header, arrays)] -> [(reply_header, reply_arrays)], in order.

        All requests go out before any reply is awaited, so the servers work in
        parallel (and one server may get several). Reply arrays are read-only
        views over the received frames (writable copies in-process).
        """
        return self.collect(self.submit(requests, timeout))

    def is_retired(self, server: int) -> bool:
        """A server a scale removed (its index stays, nothing is sent to it)."""
        return False

    def live(self) -> list[int]:
        """The indices of the servers that are not retired: whom ``leave``, ``join``, ``stats`` ask."""
        return [s for s in range(len(self)) if not self.is_retired(s)]
