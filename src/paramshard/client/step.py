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
  so the rows are exactly those of a serial run. In async mode the rows the
  step before will update can be asked for right after its push
  (``fresh_after``), so they are never staler than in a serial run either.
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
import pandas as pd

from paramshard.transport.links import ServerLinks
from paramshard.transport.requests import Ticket
from paramshard.client.dense import DenseClient
from paramshard.client.sparse import Partition, SparseClient


@dataclasses.dataclass
class _Sent:
    """A piece's pull on its way: its ticket, its requests (sent again where a partition moved)
    and how its ids were split over the servers."""
    ticket: Ticket
    requests: list
    part: Partition


@dataclasses.dataclass
class _Piece:
    """Part of a prefetch: the rows of ``ids[positions]`` (all of them: positions None)."""
    positions: np.ndarray | None
    ids: np.ndarray
    after_push: bool = False           # sent right after the next push, not now
    sent: _Sent | None = None          # None: not sent yet


@dataclasses.dataclass
class _Fetch:
    """Rows on their way for one table's next batch."""
    ids: np.ndarray
    min_version: int
    pieces: list[_Piece]

    @property
    def tickets(self) -> list[Ticket]:
        return [piece.sent.ticket for piece in self.pieces if piece.sent is not None]


@dataclasses.dataclass
class _Push:
    sparse: Ticket            # the table pushes, sent first
    sparse_requests: list     # what to send again where a partition moved
    dense: Ticket             # the dense push, whose reply carries the new values
    dense_requests: list
    values: Mapping[str, np.ndarray]
    riders: Ticket | None = None   # requests that travel with the step (the data-shard report)

    @property
    def done(self) -> bool:
        return self.sparse.done and self.dense.done and (self.riders is None or self.riders.done)


FETCHES_PER_TABLE = 2
PulledRows = _Fetch      # what pull_after_push returns: rows on their way, for take_pulled


class PipelineStats(dict[str, float]):
    """How much of the step overlapped: waits in seconds, prefetch hits and misses (counts: ints).
    A figure not counted yet is 0, as in a Counter (whose values are typed int, not seconds)."""

    def __missing__(self, key: str) -> int:
        return 0

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
        self._unused: collections.Counter[str] = collections.Counter()      # table -> prefetches in a row that no forward took
        self.stats = PipelineStats()
        self.bounded = False              # --max-staleness set: pushes carry resume_step
        self.last_staleness: int | None = None    # async: what the servers said of the latest push taken
        # Callables step -> [(server, header, arrays)] sent in every step's fan-out, right after its
        # pushes: DynamicShards' progress report (client/shards.py), so a trainer killed between
        # steps has reported exactly the data its pushed steps trained.
        self.riders: list = []

    # -- rows ---------------------------------------------------------------
    def prefetch(self, table: str, ids: np.ndarray, min_version: int,
                 fresh_after: np.ndarray | None | bool = None) -> None:
        """Send the pull of ``ids`` (distinct, uint64) for a coming forward now. Up to
        FETCHES_PER_TABLE batches of a table may be on their way (the next one, fetched
        while the current one's forward is still to come).

        ``fresh_after`` (async): the ids the step before that forward will push. Their
        rows are asked for only right after that push (the same connection: the server
        applies the push first), so no row is staler than in a serial run; the others
        go now. ``True``: that step's ids are not known, every row waits for the push."""
        queue = self._fetches.setdefault(table, collections.deque())
        while len(queue) >= FETCHES_PER_TABLE:
            self._count_unused(table, queue.popleft())
        if fresh_after is None or fresh_after is False:
            pieces = [_Piece(None, ids)]
        elif fresh_after is True:
            pieces = [_Piece(None, ids, after_push=True)]
        else:
            pushed = pd.Index(fresh_after).get_indexer(ids) >= 0       # a hash lookup, not a sort
            late, early = np.flatnonzero(pushed), np.flatnonzero(~pushed)
            pieces = [_Piece(early, ids[early]), _Piece(late, ids[late], after_push=True)]
        fetch = _Fetch(ids, min_version, pieces)
        for piece in pieces:
            if not piece.after_push:
                self._send(table, fetch, piece)
        queue.append(fetch)

    def _send(self, table: str, fetch: _Fetch, piece: _Piece) -> _Sent:
        requests, part = self.sparse.pull_requests(table, piece.ids, fetch.min_version, create=True)
        piece.sent = _Sent(self.links.submit(requests), requests, part)
        return piece.sent

    def _send_waiting_pieces(self) -> None:
        """After a push: the pulls that had to wait for it."""
        for table, queue in self._fetches.items():
            for fetch in queue:
                for piece in fetch.pieces:
                    if piece.sent is None:
                        self._send(table, fetch, piece)

    def rows(self, table: str, ids: np.ndarray, dim: int, min_version: int, create: bool = True) -> np.ndarray:
        """Rows of distinct ``ids``: the prefetched reply when it is for these very ids
        (the same array) at this version, else a pull now."""
        started = time.perf_counter()
        try:
            fetch = self._take_fetch(table, ids, min_version) if create else None
            if fetch is not None:
                return self._gather(table, fetch, dim)
            self.stats["pulls"] += 1
            return self.sparse.pull_sparse(table, ids, dim, min_version, create)
        finally:
            self.stats["pull_wait_s"] += time.perf_counter() - started

    def _gather(self, table: str, fetch: _Fetch, dim: int) -> np.ndarray:
        # A piece whose push never came (no step) is asked for now.
        sent = [piece.sent or self._send(table, fetch, piece) for piece in fetch.pieces]
        if len(fetch.pieces) == 1:
            return self.sparse.gather_rows(self._collect_rows(sent[0]), sent[0].requests, sent[0].part,
                                           len(fetch.pieces[0].ids), dim)
        out = np.empty((len(fetch.ids), dim), np.float32)
        for piece, its in zip(fetch.pieces, sent):
            if len(piece.ids):
                out[piece.positions] = self.sparse.gather_rows(self._collect_rows(its), its.requests, its.part,
                                                               len(piece.ids), dim)
            else:
                self.links.discard(its.ticket)
        return out

    def _collect_rows(self, sent: _Sent) -> list:
        """A piece's replies; parts refused as ``moved`` (a server scale) are fetched again."""
        return self.sparse.settle(self.links.collect(sent.ticket), sent.requests)

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
        for ticket in fetch.tickets:
            self.links.discard(ticket)

    def unused_in_a_row(self, table: str) -> int:
        return self._unused[table]

    def forget_fetches(self) -> None:
        """Drop the prefetched rows nobody took (the loop ended early)."""
        for table, queue in self._fetches.items():
            while queue:
                self._count_unused(table, queue.popleft())

    # -- pushes -------------------------------------------------------------
    def push(self, dense_grads: Mapping[str, np.ndarray], sparse_grads: list[tuple[str, np.ndarray, np.ndarray]],
             step: int, values: Mapping[str, np.ndarray], while_waiting=None, wait: bool = True,
             with_riders: bool = True) -> None:
        """Send step ``step``'s gradients to every server (dense, and (table, ids, grads)
        for each table); the updated dense values land in ``values`` when the reply is
        taken. Returns once at most ``max_in_flight`` pushes are unanswered (``wait`` False:
        at once; ``flush()`` or ``pushes_answered()`` then take the replies). No dense
        gradients: a push of rows only (GEO's later pieces of a round), which ``with_riders``
        False sends without the step's riders (they went with its first piece).
        ``while_waiting()``: work of the trainer's own (hybrid mode's dense update) run
        once everything is sent, while the servers work, before any reply is awaited."""
        # Order on each connection: table pushes, then the pulls that wait for them (rows
        # this push updates, for the next forward), then the dense push: that forward waits
        # for the table update only, not for the dense update and its reply.
        sparse_requests = []
        for table, ids, grads in sparse_grads:
            sparse_requests += self.sparse.push_requests(table, ids, grads, step)
        sparse_ticket = self.links.submit(sparse_requests)
        self._send_waiting_pieces()
        # Bounded staleness: the trainer starts step + 1 + window once this reply is in.
        resume = step + 1 + self.max_in_flight if self.bounded else None
        dense_requests = self.dense.push_requests(dense_grads, step, want_values=True, resume_step=resume) \
            if dense_grads else []
        dense_ticket = self.links.submit(dense_requests)
        rider_requests = [request for rider in self.riders for request in rider(step)] if with_riders else []
        riders = self.links.submit(rider_requests) if rider_requests else None
        self._pushes.append(_Push(sparse_ticket, sparse_requests, dense_ticket, dense_requests, values, riders))
        self.stats["steps"] += 1
        if while_waiting is not None:
            while_waiting()
        while wait and len(self._pushes) > self.max_in_flight:
            self._finish_oldest()
        # Replies already here cost nothing to take, and make the next forward fresher.
        if self._pushes:
            self.links.poll_replies()
            while self._pushes and self._pushes[0].done:
                self._finish_oldest()
        # What the next forward may miss: this many of its own steps' dense updates.
        self.stats["max_in_flight_seen"] = max(self.stats["max_in_flight_seen"], len(self._pushes))

    def _finish_oldest(self) -> None:
        push = self._pushes.popleft()     # collected or failed, it is no longer in flight
        started = time.perf_counter()
        try:
            self.sparse.settle(self.links.collect(push.sparse), push.sparse_requests)
            # Blocks refused as moved (an elastic job's server change) go again to their new owners.
            requests, replies = self.dense.settle(self.links.collect(push.dense), push.dense_requests)
            if push.riders is not None:
                self.links.collect(push.riders)
        except BaseException:
            self.links.discard(push.dense)
            if push.riders is not None:
                self.links.discard(push.riders)
            raise
        finally:
            self.stats["push_wait_s"] += time.perf_counter() - started
        seen = [header.get("staleness") for header, _ in replies if header.get("staleness") is not None]
        # Blocks a move froze while their bounded-staleness reply waited: pulled from their owners.
        requests, replies = self.dense.catch_up(requests, replies)
        self.dense.scatter(requests, replies, push.values)
        if seen:
            self.last_staleness = max(seen)

    def pushes_answered(self) -> bool:
        """Take the replies that are in (pushes' and pulls'), without waiting; True when no push
        is unanswered."""
        self.links.poll_replies()
        while self._pushes and self._pushes[0].done:
            self._finish_oldest()
        return not self._pushes

    # -- pulls that follow a push (GEO: the merged rows of a round just sent) -------------
    def pull_after_push(self, table: str, ids: np.ndarray) -> PulledRows:
        """Send the pull of distinct ``ids`` now: on each connection it follows the pushes sent
        before it, so the rows come back with them applied. ``take_pulled`` takes the reply."""
        fetch = _Fetch(ids, 0, [_Piece(None, ids)])
        self._send(table, fetch, fetch.pieces[0])
        return fetch

    def pulled(self, fetch: PulledRows) -> bool:
        """Whether ``fetch``'s replies are all in (``poll_replies`` or ``pushes_answered`` took them)."""
        return all(ticket.done for ticket in fetch.tickets)

    def take_pulled(self, table: str, fetch: PulledRows, dim: int) -> np.ndarray:
        """``pull_after_push``'s rows, waiting for them (parts refused as moved are fetched again)."""
        return self._gather(table, fetch, dim)

    def discard_pulled(self, fetch: PulledRows) -> None:
        for ticket in fetch.tickets:
            self.links.discard(ticket)

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
            self.links.discard(push.sparse)
            self.links.discard(push.dense)
            if push.riders is not None:
                self.links.discard(push.riders)
        self._pushes.clear()
        self.forget_fetches()
