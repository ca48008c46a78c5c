"""A server that nothing it expects ever reaches does not serve for ever.

The job's own rules end a server once its trainers are done or lost
(barrier.Membership), but a trainer that never connects is neither: a server
started by hand whose trainers were never started (or point at another
address) would wait for ever. The watch counts from the start of serving; a
``hello`` (a launcher or trainer checking the server is up) starts the count
again; monitoring (``stats``, ``routing_get``) does not count at all: a
dashboard polling a server nobody trains with must not keep it alive. Any other
request that passed the server's checks means the job found it: a trainer's
(even one refused for now, as a restarted server refuses pushes until the
chief's restore), a launcher's move of partitions or blocks to a server a
scale added, a restore, a replica keeper's read. From then on the watch is
over and the job's rules alone decide when the server ends, so a server that
legitimately waits is never cut short once its job reached it; a slow start
under load fits the limit's default floor (``default_limit``).
"""
from __future__ import annotations

import time

# Requests that only look at a server: they say nothing about its job.
OBSERVING = frozenset({"stats", "routing_get"})
# Requests that show someone is about to use it, without being its job's work yet.
PROBING = frozenset({"hello"})
# A server's default limit is PARAMSHARD_TIMEOUT, but never less than this: the timeout
# bounds one wait between running processes, while a trainer's start (interpreter, torch,
# the script's own setup) on a loaded host can take far longer than a short test timeout.
MIN_DEFAULT_LIMIT = 60.0


def default_limit(idle_exit: float | None, timeout: float) -> float | None:
    """Seconds a server waits for its first trainer: PARAMSHARD_IDLE_EXIT (``--idle-exit``)
    when set (0: for ever, None returned), else PARAMSHARD_TIMEOUT, at least MIN_DEFAULT_LIMIT."""
    if idle_exit is not None:
        return float(idle_exit) or None
    return max(float(timeout), MIN_DEFAULT_LIMIT)


class IdleWatch:
    def __init__(self, limit: float | None, clock=time.monotonic):
        """``limit``: seconds without a job's request before a server no trainer reached
        gives up; None: never."""
        self.limit = limit
        self._clock = clock
        self.started_at = self.last_request = clock()
        self.probes = 0             # hellos seen: each started the count again
        self.job_arrived = False    # a request of the job's work: the watch is over

    def note(self, op: str) -> None:
        """A request that passed the server's checks (a trainer it names belongs to the job)."""
        if op in OBSERVING:
            return
        self.last_request = self._clock()
        if op in PROBING:
            self.probes += 1
        else:
            self.job_arrived = True

    def expired(self) -> bool:
        """True once nothing of a job reached this server and no probe came for ``limit`` seconds."""
        return (self.limit is not None and not self.job_arrived
                and self._clock() - self.last_request >= self.limit)

    def waited(self) -> float:
        return self._clock() - self.started_at
