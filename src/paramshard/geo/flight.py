"""A GEO round on the wire: sent in pieces, one per step boundary, so a step's own traffic never
waits long behind it (trainer/backends/geo.py decides when each piece goes and when the round
lands; this module holds what was sent and moves it).

Why pieces: a step's row pulls travel on the same connection as the round (one DEALER socket
per server, one TCP stream), behind it. Sent whole, a round of k = 64 on the CTR demo (7.6 MB
each way) held the next step's pull 1.2 s at 100 Mbit/s, about the time an overlapped send
saved (RESULTS section 23, "Stop 43"). A piece is a push of some of the round's rows (the
first also carries the dense blocks and the step's riders) and, after it on each connection,
the pull of the same rows: the servers add any split of a round exactly as the whole.

Each push carries a step number of its own, increasing (``push_step``): the servers tell a
push resent after a restore from one they hold by trainer and step (server/elastic/
replication.py), so two pieces must never share one.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from paramshard.client.step import PulledRows, StepClient
from paramshard.geo.replica import TableReplica


@dataclasses.dataclass
class SentRows:
    """One table's part of a round: the rows, what goes out for them and their local values at
    the send; ``pulls``: (first, end, the pull of rows first..end) of each piece sent so far."""
    replica: TableReplica
    pos: np.ndarray           # the rows' positions in the replica
    ids: np.ndarray
    grads: np.ndarray         # what goes out for them (round_delta's)
    at_send: np.ndarray       # their local values when the round went out
    pulls: list[tuple[int, int, PulledRows]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Flight:
    """A round sent (some of it, or all) and not landed yet: what it measured, what its merge
    needs, and how far its pieces have gone."""
    step: int                 # the trainer's step count at the send
    steps: int                # local steps in the round (its k)
    compute: float            # seconds
    started: float            # perf_counter at the send
    blocked: float            # seconds the sends took from training so far
    bytes_sent: int
    delta_sq: float
    dense_grads: dict
    dense_into: dict          # where the first piece's reply writes the merged dense values
    dense_merged: dict | None     # ... when that is beside the parameters (None: into them, blocking)
    dense_at_send: dict | None    # the dense values at the send (None: blocking, nothing trained since)
    tables: list[SentRows]
    sent_rows: int = 0        # rows of the round sent so far, table after table
    pieces: int = 0
    piece_sent_at: float = 0.0            # perf_counter when the latest piece went out
    piece_answered_at: float | None = None    # ... and when it was seen answered (None: not yet)

    @property
    def rows(self) -> int:
        return sum(len(t.ids) for t in self.tables)

    @property
    def unsent(self) -> bool:
        return self.pieces == 0 or self.sent_rows < self.rows

    def send_piece(self, steps: StepClient, rows: int, push_step: int, now: float) -> None:
        """Push the next ``rows`` rows (the first piece: the dense blocks too) under ``push_step``
        and pull them back after it."""
        end = min(self.rows, self.sent_rows + rows)
        first = self.pieces == 0
        sparse, parts, offset = [], [], 0
        for table in self.tables:
            lo, hi = max(self.sent_rows - offset, 0), min(end - offset, len(table.ids))
            if lo < hi:
                sparse.append((table.replica.name, table.ids[lo:hi], table.grads[lo:hi]))
                parts.append((table, lo, hi))
            offset += len(table.ids)
        steps.push(self.dense_grads if first else {}, sparse, push_step, self.dense_into, wait=False, with_riders=first)
        for table, lo, hi in parts:
            table.pulls.append((lo, hi, steps.pull_after_push(table.replica.name, table.ids[lo:hi])))
        self.sent_rows, self.pieces = end, self.pieces + 1
        self.piece_sent_at, self.piece_answered_at = now, None

    def answered(self, steps: StepClient) -> bool:
        """Every piece sent so far has its replies in (taking those that came, without waiting)."""
        return steps.pushes_answered() and all(steps.pulled(fetch) for t in self.tables for _, _, fetch in t.pulls)

    def merged_rows(self, steps: StepClient, table: SentRows) -> np.ndarray:
        """The merged rows of ``table`` (every piece sent: waiting for their replies), in its order."""
        out = np.empty((len(table.ids), table.replica.dim), np.float32)
        for lo, hi, fetch in table.pulls:
            out[lo:hi] = steps.take_pulled(table.replica.name, fetch, table.replica.dim)
        return out

    def discard(self, steps: StepClient) -> None:
        """Forget the pulls' replies (a rollback, the job's end)."""
        for table in self.tables:
            for _, _, fetch in table.pulls:
                steps.discard_pulled(fetch)
            table.pulls.clear()
