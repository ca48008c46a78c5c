"""Two copies of the served model and the version switch: a change is applied while lookups go on.

Lookups read the *live* copy; a change is applied to the other (*back*) copy, then the live
reference switches to it (the version switch: a pointer swap under a lock held for nothing
else), and once no lookup still reads the old copy, the same change is applied to it. A lookup
takes the live copy and its version together when it starts and reads that copy to the end, so
it sees one whole version and answers with it; no lookup ever waits for a change to be applied.

A lookup that is still reading the old copy when the next change comes is waited for, up to
``grace`` seconds (a deadline: a stuck lookup must not block the replica forever); past it, the
change is refused (``Busy``), both copies stay as they were and the caller tries again later.
The old copy's catch-up is a list of changes it still lacks (``_lag``): applied before it next
becomes the back copy, so a copy that could not be caught up at once is never used behind.

Costs: twice the memory of one copy (copy-on-write per partition would share what did not change;
two copies keep a lookup's path free of any per-row indirection), and every change is applied
twice (measured in benchmarks/serving_apply.py).
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Generic, TypeVar

from paramshard.errors import ParamshardError

Copy = TypeVar("Copy")


class Busy(ParamshardError):
    """A lookup still read the copy a change had to be applied to when the grace period ended."""


class Broken(ParamshardError):
    """A change failed half-way on the back copy: that copy is no longer a version of the model."""


class DoubleBuffer(Generic[Copy]):
    def __init__(self, first: Copy, second: Copy, version: dict, grace: float = 30.0):
        self._copies = (first, second)
        self._versions = [version, version]
        self._live = 0
        self._readers = [0, 0]
        self._lag: list[list[Callable[[Copy], None]]] = [[], []]
        self._cond = threading.Condition()
        self._writer = threading.Lock()          # one change at a time
        self.grace = grace
        self.broken: str | None = None
        # Measured: seconds of the last change (both copies), the longest one, the longest a
        # lookup waited to start (the version switch's lock), how many switches.
        self.last_apply_s = self.max_apply_s = self.max_stall_s = 0.0
        self.switches = 0

    @property
    def version(self) -> dict:
        with self._cond:
            return self._versions[self._live]

    @property
    def copies(self) -> tuple[Copy, Copy]:
        return self._copies

    @contextlib.contextmanager
    def reading(self):
        """``with buffer.reading() as (copy, version):`` the live copy, unchanged until the block ends."""
        started = time.perf_counter()
        with self._cond:
            index = self._live
            self._readers[index] += 1
            version = self._versions[index]
        stall = time.perf_counter() - started
        if stall > self.max_stall_s:
            self.max_stall_s = stall
        try:
            yield self._copies[index], version
        finally:
            with self._cond:
                self._readers[index] -= 1
                if not self._readers[index]:
                    self._cond.notify_all()

    def apply(self, change: Callable[[Copy], None], version: dict) -> None:
        """Apply ``change`` (a function of a copy) to both copies, switching the live version to
        ``version`` in between. Busy: a lookup held the back copy past the grace period (nothing
        changed). Broken: ``change`` raised on the back copy (still live: the old version)."""
        with self._writer:
            if self.broken:
                raise Broken(self.broken)
            started = time.perf_counter()
            back = 1 - self._live
            self._drain(back, self.grace)
            self._catch_up(back)
            self._run(change, back)
            with self._cond:
                old, self._live = self._live, back
                self._versions[back] = version
                self.switches += 1
            self._lag[old].append(change)
            try:                             # the old copy now, if its readers finish in time
                self._drain(old, self.grace)
                self._catch_up(old)
            except Busy:
                pass                         # caught up before it is next written (apply's first _drain)
            self.last_apply_s = time.perf_counter() - started
            self.max_apply_s = max(self.max_apply_s, self.last_apply_s)

    def _catch_up(self, index: int) -> None:
        lag, self._lag[index] = self._lag[index], []
        for i, change in enumerate(lag):
            try:
                self._run(change, index)
            except Broken:
                self._lag[index] = lag[i + 1:]
                raise
        with self._cond:
            self._versions[index] = self._versions[1 - index]

    def _run(self, change, index: int) -> None:
        try:
            change(self._copies[index])
        except Exception as exc:     # noqa: BLE001 - whatever it was, this copy is now half-changed
            self.broken = (f"a change failed half-way on a copy of the model ({type(exc).__name__}: {exc}); "
                           f"the replica serves the version before it and applies no more: restart it")
            raise Broken(self.broken) from exc

    def _drain(self, index: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._readers[index]:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Busy(f"{self._readers[index]} lookup(s) still read the model's previous version after "
                               f"{timeout:g} s (the grace period): the change waits for the next poll")
                self._cond.wait(left)
