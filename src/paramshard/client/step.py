"""The per-step fan-out of one trainer: pushes in flight, rows fetched ahead.

A training step talks to every server twice: rows for the batch's ids (in
the forward) and gradients up with the new dense values back (in ``step``).
Done one after the other, the trainer's core waits while a server works and
the other way round. This module lets the two overlap, with ZeroMQ moving the
bytes in its own thread while Python computes:

- **Prefetch**: ``prefetch(table, ids, version)`` sends the pull for the next
  batch at once; ``rows()`` in that batch's forward takes the reply (or pulls
  afresh if the ids or the version are not the ones fetched). In sync mode the
  version makes the server hold the reply until the step before is complete,
  so the rows are exactly those of a serial run.
- **Pushes in flight** (async mode): ``push()`` sends a step's gradients and
  returns; the dense values of the reply are written into the parameters when
  more than ``max_in_flight`` pushes are out (or the reply is already in). A
  forward therefore sees the dense values of at most ``max_in_flight`` steps
  ago, its own pushes included: the bounded staleness of async SGD.

``flush()`` waits for every push (before a checkpoint, an evaluation or
leaving); ``drop()`` forgets everything in flight (a rollback voids it).
"""
from __future__ import annotations

import collections
import dataclasses
import time
from typing import Mapping

import numpy as np

from ..transport.client import ServerLinks, Ticket
from .dense import DenseClient
from .sparse import Partition, SparseClient


@dataclasses.dataclass
class _Fetch:
    """Rows on their way for one table's next batch."""
    ids: np.ndarray
    min_version: int
    ticket: Ticket
    requests: list
    part: Partition


@dataclasses.dataclass
class _Push:
    ticket: Ticket
    dense_requests: list
    values: Mapping[str, np.ndarray]


FETCHES_PER_TABLE = 2


class PipelineStats(collections.Counter):
    """How much of the step overlapped: waits in seconds, prefetch hits and misses."""

    def as_dict(self) -> dict:
        keys = ("steps", "prefetch_hits", "prefetch_misses", "pulls", "pull_wait_s", "push_wait_s",
                "max_in_flight_seen")
        return {k: (round(self[k], 6) if isinstance(self[k], float) else self[k]) for k in keys}


class StepClient:
    def __init__(self, links: ServerLinks, dense: DenseClient, sparse: SparseClient, max_in_flight: int = 0):
        if max_in_flight < 0:
            raise ValueError("max_in_flight must be >= 0")
        self.links, self.dense, self.sparse = links, dense, sparse
        self.max_in_flight = max_in_flight
        self._pushes: collections.deque[_Push] = collections.deque()
        self._fetches: dict[str, collections.deque[_Fetch]] = {}
        self._unused = collections.Counter()      # table -> prefetches in a row that no forward took
        self.stats = PipelineStats()

    # -- rows ---------------------------------------------------------------
    def prefetch(self, table: str, ids: np.ndarray, min_version: int) -> None:
        """Send the pull of ``ids`` (distinct, uint64) for a coming forward now. Up to
        FETCHES_PER_TABLE batches of a table may be on their way (the next one, fetched
        while the current one's forward is still to come)."""
        queue = self._fetches.setdefault(table, collections.deque())
        while len(queue) >= FETCHES_PER_TABLE:
            self._count_unused(table, queue.popleft())
        requests, part = self.sparse.pull_requests(table, ids, min_version, create=True)
        queue.append(_Fetch(ids, min_version, self.links.submit(requests), requests, part))

    def rows(self, table: str, ids: np.ndarray, dim: int, min_version: int, create: bool = True) -> np.ndarray:
        """Rows of distinct ``ids``: the prefetched reply when it is for these very ids
        (the same array) at this version, else a pull now."""
        started = time.perf_counter()
        try:
            fetch = self._take_fetch(table, ids, min_version) if create else None
            if fetch is not None:
                replies = self.links.collect(fetch.ticket)
                return self.sparse.gather_rows(replies, fetch.requests, fetch.part, len(ids), dim)
            self.stats["pulls"] += 1
            return self.sparse.pull_sparse(table, ids, dim, min_version, create)
        finally:
            self.stats["pull_wait_s"] += time.perf_counter() - started

    def _take_fetch(self, table: str, ids: np.ndarray, min_version: int) -> _Fetch | None:
        """The fetch of these ids; fetches queued before it were for batches that never came."""
        queue = self._fetches.get(table)
        if not queue or not any(f.ids is ids for f in queue):
            return None
        while True:
            fetch = queue.popleft()
            if fetch.ids is not ids:
                self._count_unused(table, fetch)
            elif fetch.min_version != min_version:    # a step went differently than foreseen: pull afresh
                self._count_unused(table, fetch)
                return None
            else:
                self.stats["prefetch_hits"] += 1
                self._unused[table] = 0
                return fetch

    def _count_unused(self, table: str, fetch: _Fetch) -> None:
        self.stats["prefetch_misses"] += 1
        self._unused[table] += 1
        self.links.discard(fetch.ticket)

    def unused_in_a_row(self, table: str) -> int:
        return self._unused[table]

    def forget_fetches(self) -> None:
        """Drop the prefetched rows nobody took (the loop ended early)."""
        for table, queue in self._fetches.items():
            while queue:
                self._count_unused(table, queue.popleft())

    # -- pushes -------------------------------------------------------------
    def push(self, dense_grads: Mapping[str, np.ndarray], sparse_grads: list[tuple[str, np.ndarray, np.ndarray]],
             step: int, values: Mapping[str, np.ndarray]) -> None:
        """Send step ``step``'s gradients to every server (dense, and (table, ids, grads)
        for each table); the updated dense values land in ``values`` when the reply is
        taken. Returns once at most ``max_in_flight`` pushes are unanswered."""
        dense_requests = self.dense.push_requests(dense_grads, step, want_values=True)
        requests = list(dense_requests)
        for table, ids, grads in sparse_grads:
            requests += self.sparse.push_requests(table, ids, grads, step)
        self._pushes.append(_Push(self.links.submit(requests), dense_requests, values))
        self.stats["steps"] += 1
        while len(self._pushes) > self.max_in_flight:
            self._finish_oldest()
        # Replies already here cost nothing to take, and make the next forward fresher.
        if self._pushes:
            self.links.poll_replies()
            while self._pushes and self._pushes[0].ticket.done:
                self._finish_oldest()
        # What the next forward may miss: this many of its own steps' dense updates.
        self.stats["max_in_flight_seen"] = max(self.stats["max_in_flight_seen"], len(self._pushes))

    def _finish_oldest(self) -> None:
        push = self._pushes.popleft()     # collected or failed, it is no longer in flight
        started = time.perf_counter()
        try:
            replies = self.links.collect(push.ticket)
        finally:
            self.stats["push_wait_s"] += time.perf_counter() - started
        self.dense.scatter(push.dense_requests, replies[:len(push.dense_requests)], push.values)

    @property
    def in_flight(self) -> int:
        """Pushes not answered yet."""
        return len(self._pushes)

    @property
    def fetches_in_flight(self) -> int:
        """Prefetched batches no forward has taken yet."""
        return sum(len(queue) for queue in self._fetches.values())

    def flush(self) -> None:
        """Wait for every push in flight and take its dense values."""
        while self._pushes:
            self._finish_oldest()

    def drop(self) -> None:
        """Forget every push and prefetch in flight (their replies are dropped)."""
        for push in self._pushes:
            self.links.discard(push.ticket)
        self._pushes.clear()
        self.forget_fetches()
