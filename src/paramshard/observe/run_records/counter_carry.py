"""A server's counters across its restarts: job totals that never go backwards.

A server restarted in place (launch/supervision/launcher.py) is a new process whose counters
(requests, bytes in and out, the staleness histogram) start again from 0. Taken as
they are, its next record shows a negative request rate and a share of the load that
forgot everything it served before: a false imbalance between servers. A counter that
goes down can only mean a new process, so ``CounterCarry`` treats it as a restart:
it adds the totals the server had reached before it to every later record, and counts
from the new start from there on.

Applied where the launcher makes server records (observe/run_records/run_dir.py) and where records
are read (observe/run_records/run_data.py, for run directories each rank wrote itself). A carried
record says so with its ``restarts``: a second pass leaves it as it is.
"""
from __future__ import annotations

import math

CARRIED = ("requests", "bytes_in", "bytes_out")    # cumulative counters of a server record


def _count(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0
    return value


def _histogram(value) -> dict[str, int]:
    if not isinstance(value, dict):
        return {}
    return {str(k): n for k, n in value.items() if isinstance(n, int) and not isinstance(n, bool)}


UPTIME_SLACK = 1.0     # seconds: how far two readers' clocks of one process may disagree


def went_down(before: dict, now: dict) -> bool:
    """Is ``now`` from another process than ``before``? Records that carry the process's start
    (``started_at``) say so exactly: a new process may already have served more than the old one
    had at its previous record, and be older than it was then (its first record was taken soon
    after the old one's start), so neither counters nor uptime can tell (CI, stop 40). Older
    records: did any cumulative counter of ``now`` go below ``before``'s, or did its process start
    after ``before`` was taken? The uptime catches a new process that already
    served more than the old one had when the previous record was taken. Its uptime must be
    younger than the time between the two records: two readers of the same process (the
    launcher's live read and the server's own last record, made from its cached snapshot)
    can see its uptime a few milliseconds apart and out of order, which is no restart."""
    start_before, start_now = _count(before.get("started_at")), _count(now.get("started_at"))
    if start_before and start_now:
        return start_now != start_before
    if any(_count(now.get(k)) < _count(before.get(k)) for k in CARRIED):
        return True
    up_before, up_now = _count(before.get("uptime_s")), _count(now.get("uptime_s"))
    if not all(isinstance(r.get("t"), (int, float)) for r in (before, now)):
        return up_now < up_before                    # no times to compare: any step back is one
    between = max(0.0, _count(now.get("t")) - _count(before.get("t")))
    return up_now < up_before and up_now <= between + UPTIME_SLACK


class CounterCarry:
    """One server's records in time order -> the same records with job totals."""

    def __init__(self):
        self._base = {k: 0 for k in CARRIED}       # what earlier processes of this server counted
        self._base_staleness: dict[str, int] = {}
        self._last: dict | None = None             # the previous record as the server sent it
        self.restarts = 0

    def carry(self, record: dict) -> tuple[dict, bool]:
        """(a copy of ``record`` with totals over every process of this server, whether its
        counters started again since the previous record)."""
        if "restarts" in record:
            return dict(record), False           # carried where it was made: totals already
        last = self._last
        restarted = last is not None and went_down(last, record)
        if last is not None and restarted:
            self.restarts += 1
            for k in CARRIED:
                self._base[k] += _count(last.get(k))
            for k, n in _histogram(last.get("staleness")).items():
                self._base_staleness[k] = self._base_staleness.get(k, 0) + n
        self._last = record
        out = dict(record)
        for k in CARRIED:
            if k in record or self._base[k]:
                out[k] = self._base[k] + _count(record.get(k))
        if "staleness" in record or self._base_staleness:
            merged = dict(self._base_staleness)
            for k, n in _histogram(record.get("staleness")).items():
                merged[k] = merged.get(k, 0) + n
            out["staleness"] = merged
        out["restarts"] = self.restarts
        return out, restarted


def carry_series(records: list[dict]) -> list[dict]:
    """One server's records (time order) with totals that survive its restarts."""
    carry = CounterCarry()
    return [carry.carry(r)[0] for r in records]
