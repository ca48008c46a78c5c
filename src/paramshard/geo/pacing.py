"""How big each piece of an overlapped GEO round is (geo/flight.py says why rounds go in pieces).

A piece's round trip (its push up, the servers' work, its rows back) should take about half a
step: a step's own pulls, which queue behind it on the same connections, then wait for little,
and the round still goes out as fast as the link allows. The pacer measures each piece's round
trip (taken at the step boundaries and at each forward's row read: within half a step) and the
seconds between step boundaries, and doubles the rows of the next piece when a piece came back
within half a step, halves them when one took more than a step. A round is never cut in more
pieces than half its next k (one piece goes per boundary: its merge then lands half a round
after its send, before the next round is due).

Measured (CTR demo, 2 + 2, k = 64, 100 Mbit/s, RESULTS section 23 "Stop 43"; a round is ~100,000
rows): the whole round at once trained 39,000 samples/s (a step's pulls waited behind it up to
1.2 s); in 4 pieces 41,400, 8 43,200, 16 45,100, 32 pieces 50,200 (blocking sends: 38,100).
"""
from __future__ import annotations

import math

START_ROWS = 4096        # the first piece's rows: ~295 kB of dim-16 rows, about a 40 ms step at 100 Mbit/s
MIN_ROWS = 256
MAX_ROWS = 1 << 24
SMOOTHING = 0.2          # weight of the latest step in the seconds-per-step average


class Pacer:
    def __init__(self, rows: int = START_ROWS):
        self.rows = rows
        self.step_seconds: float | None = None     # between two step boundaries, smoothed
        self._last_boundary: float | None = None

    def boundary(self, now: float) -> None:
        """A step boundary at ``now`` (seconds, any monotonic clock)."""
        if self._last_boundary is not None:
            step = now - self._last_boundary
            self.step_seconds = step if self.step_seconds is None else \
                (1 - SMOOTHING) * self.step_seconds + SMOOTHING * step
        self._last_boundary = now

    def paused(self, seconds: float) -> None:
        """Time between two boundaries that was no step (an evaluation)."""
        if self._last_boundary is not None:
            self._last_boundary += seconds

    def answered(self, round_trip: float) -> None:
        """A piece came back ``round_trip`` seconds after it went out."""
        if self.step_seconds is None or not math.isfinite(round_trip):
            return
        if round_trip <= self.step_seconds / 2:
            self.rows = min(MAX_ROWS, 2 * self.rows)
        elif round_trip > self.step_seconds:
            self.rows = max(MIN_ROWS, self.rows // 2)

    def piece_rows(self, round_rows: int, next_k: int) -> int:
        """Rows of the next piece of a round of ``round_rows`` rows, before a round of ``next_k`` steps."""
        return max(1, self.rows, math.ceil(round_rows / max(1, next_k // 2)))
