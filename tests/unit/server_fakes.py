"""Small real pieces for unit tests of server services: a manual clock, a ServerContext with a
recorded ``resubmit``, and an Answer that records what a waiting request got. No sockets."""
from __future__ import annotations

from paramshard.mode import Mode
from paramshard.server.core.barrier import Membership
from paramshard.server.core.context import ServerContext
from paramshard.server.core.waiting import WaitingList


class Clock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class Recorded:
    """An Answer (server/core/waiting.py) that keeps what it was given."""
    def __init__(self):
        self.replies, self.errors, self.failures = [], [], []

    def reply(self, reply):
        self.replies.append(reply)

    def error(self, code, message):
        self.errors.append((code, message))

    def failure(self, op, exc):
        self.failures.append((op, exc))


def context(mode=Mode.SYNC, trainers=2, timeout=5.0, clock=None, epoch=0, min_trainers=None):
    """A ServerContext whose ``resubmit`` records the requests handed back (``ctx.resubmitted``);
    ``min_trainers`` set: an elastic job."""
    clock = clock or Clock()
    membership = Membership(trainers, grace=timeout, clock=clock, min_trainers=min_trainers)
    waiting = WaitingList("server 0", membership, timeout, clock=clock)
    resubmitted = []
    ctx = ServerContext(0, mode, membership, timeout, waiting, epoch=epoch, resubmit=resubmitted.append,
                        snapshot_stats=lambda: {"server": 0})
    ctx.resubmitted = resubmitted
    return ctx
