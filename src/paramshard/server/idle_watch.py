"""A server that nothing it expects ever reaches does not serve for ever.

The job's own rules end a server once its trainers are done or lost
(barrier.Membership), but a trainer that never connects is neither: a server
started by hand whose trainers were never started (or point at another
address) would wait for ever. The watch counts from the server's start, and any
request that belongs to a job resets it: a trainer's, the launcher's moves of
partitions to a server a scale added, a chief's restore onto a server restarted
in place, a replica keeper's reads. Monitoring (``stats``, ``routing_get``) does
not: a dashboard polling a server nobody trains with must not keep it alive.
Once a trainer of the job has reached the server, the watch is over and the
job's rules alone decide when it ends; so a job whose trainers are merely slow
to start is never cut short once one arrived, and a slow start under load fits
the limit's default floor (``default_limit``).
"""
from __future__ import annotations

import time

# Requests that only look at a server: they say nothing about its job.
OBSERVING = frozenset({"stats", "routing_get"})
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
        self.requests = 0           # job requests seen (those that reset the watch)
        self.trainer_reached = False

    def note(self, op: str, trainer: int | None) -> None:
        """A request that passed the server's checks (``trainer``: the job's trainer it names)."""
        if op in OBSERVING:
            return
        self.requests += 1
        self.last_request = self._clock()
        if trainer is not None:
            self.trainer_reached = True

    def expired(self) -> bool:
        """True once no trainer reached this server and no job request came for ``limit`` seconds."""
        return (self.limit is not None and not self.trainer_reached
                and self._clock() - self.last_request >= self.limit)

    def waited(self) -> float:
        return self._clock() - self.started_at
