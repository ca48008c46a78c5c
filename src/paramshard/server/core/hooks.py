"""Request hooks: checks a service declares on every request, run by the core loop.

Before a request's handler runs, each hook of each service (in the order the
services were added) says ``ACCEPT`` (go on), ``HOLD`` (the hook keeps the
request and hands it back later through ``ServerContext.resubmit``) or refuses
it by raising a ParamshardError, which becomes the error reply. After a handler
ran, every hook hears of it (``applied``); about ten times a second the socket
loop gives each hook a ``tick`` (for time limits). The epoch check
(control_handlers.py) and the push gate of async checkpoints
(checkpoint_service.py) are hooks.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Protocol


class Verdict(enum.Enum):
    ACCEPT = "accept"
    HOLD = "hold"


@dataclasses.dataclass
class Incoming:
    """A validated request as hooks see it. ``held`` is what ``resubmit`` takes back to run it
    again (the socket's frames); None where a request cannot be held (the in-process path:
    its one trainer saves between its own steps, so no push arrives during a cut)."""
    op: str
    header: dict
    trainer: int | None
    held: Any = None

    def pusher(self) -> int:
        """The trainer of a push (push_dense, push_sparse): every push names one (validate_request
        requires its field 'trainer' and the core's _admit checked it is an int)."""
        assert self.trainer is not None, f"{self.op} without a trainer passed validate_request"
        return self.trainer


class RequestHook(Protocol):
    def admit(self, request: Incoming) -> Verdict:
        """ACCEPT, HOLD (then the hook keeps ``request.held``), or raise to refuse."""

    def applied(self, request: Incoming) -> None:
        """The request's handler ran (whatever it returned)."""

    def tick(self) -> None:
        """Called about ten times a second by the socket loop."""
