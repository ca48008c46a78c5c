"""The launcher's watcher: asks every server for its counters every few seconds,
turns them into server records (rates since the last ask), writes the plan once
the chief registered (again while a poll saw only part of the registration), and drives the live progress.

It is a client like the trainers (same keys), asking only ``stats``
(client/control.py), which every server answers at once; a server that does
not answer is skipped this time (the launcher's own supervision reports dead
processes).
"""
from __future__ import annotations

import threading
import time

from paramshard.client import control
from paramshard.errors import ParamshardError
from paramshard.log import get_logger
from paramshard.messages.server_stats import ServerStats
from paramshard.observe.run_records.records import SERVER_EVERY
from paramshard.observe.live.server_list import JobServers

log = get_logger("launch")
PUSH_OPS = ("push_dense", "push_sparse")


def server_record(stats: ServerStats, before: ServerStats | None, now: float, then: float | None) -> dict:
    """One server's record (observe/run_records/records.py) from its ``stats`` reply, with rates against the
    previous one."""
    if before is not None and _restarted(stats, before):
        # A server restarted in place counts from 0 again: its rates are from its new start,
        # never negative (RunDir adds the totals of its earlier process: observe/run_records/counter_carry.py).
        before = None
    restarted = before is None
    before = before or ServerStats(server=stats.server)       # no previous ask: every figure from 0
    dt = (now - then) if then else None
    if dt and restarted and stats.uptime_s:
        dt = min(dt, stats.uptime_s)          # a restarted server counted only since it started
    pushes = sum(stats.counter(f"op_{op}") for op in PUSH_OPS)
    old_pushes = sum(before.counter(f"op_{op}") for op in PUSH_OPS)
    update = (sum(stats.phase_seconds.get(op, 0.0) for op in PUSH_OPS)
              - sum(before.phase_seconds.get(op, 0.0) for op in PUSH_OPS))
    waited = stats.counter("deferred_wait_s") - before.counter("deferred_wait_s")
    answered = stats.counter("deferred_answered") - before.counter("deferred_answered")
    return {
        "kind": "server", "t": now, "server": stats.server,
        "rows": stats.sparse_rows, "elements": stats.dense_elements,
        "bytes_in": stats.counter("bytes_in"), "bytes_out": stats.counter("bytes_out"), "requests": stats.requests,
        "requests_per_s": round((stats.requests - before.requests) / dt, 2) if dt else None,
        "queue_s": round(waited / answered, 6) if answered > 0 else 0.0,
        "update_s": round(update / (pushes - old_pushes), 6) if pushes > old_pushes else None,
        "staleness": {str(k): n for k, n in stats.staleness.items()},     # JSON keys, as on the wire
        "live_trainers": len(stats.trainers.live),
        "uptime_s": stats.uptime_s,
        # Another than before: a new process (observe/run_records/counter_carry.py); absent if not sent.
        **({"started_at": stats.started_at} if stats.started_at else {}),
        **_tier_record(stats),
        # A server publishing deltas: what it published (its DeltaStats as on the wire; cumulative per process).
        **({"deltas": stats.deltas.to_wire()["deltas"]} if stats.deltas is not None else {}),
    }


def _restarted(stats: ServerStats, before: ServerStats) -> bool:
    """Another process answers for this server: its start differs, or (a server that does not
    send it) a counter went down since the previous ask."""
    if stats.started_at and before.started_at:
        return stats.started_at != before.started_at
    return (stats.uptime_s < before.uptime_s or stats.requests < before.requests
            or any(stats.counter(k) < before.counter(k) for k in ("bytes_in", "bytes_out")))


def _tier_record(stats: ServerStats) -> dict:
    """The disk tier of tables with a memory budget, by table (absent when none has one)."""
    tiers = {name: {"budget": t.tier.budget, "resident_bytes": t.tier.resident_bytes, "hit_rate": t.tier.hit_rate,
                    "spills": t.tier.spills, "promotions": t.tier.promotions}
             for name, t in stats.tables.items() if t.tier is not None}
    out: dict = {"tier": tiers} if tiers else {}
    if stats.sparse is not None and stats.sparse.memory_budget is not None:
        out["memory_budget"] = stats.sparse.memory_budget
        out["rss_bytes"] = stats.sparse.rss_bytes
    return out


class Monitor:
    """``connect_one`` (address -> links to that server): an elastic job, whose servers a scale
    may add: each poll follows the routing server 0 holds (observe/live/server_list.py)."""

    def __init__(self, run_dir, links, progress=None, every: float = SERVER_EVERY, connect_one=None):
        self.run_dir, self.links, self.progress, self.every = run_dir, links, progress, every
        self.servers = JobServers(links, connect_one) if connect_one is not None else None
        self._stop = threading.Event()
        self._before: dict[int, tuple[ServerStats, float]] = {}
        self._plan_held: tuple[int, frozenset] | None = None     # what the plan written says is held
        self._thread = threading.Thread(target=self._loop, name="monitor", daemon=True)

    def start(self) -> "Monitor":
        self._thread.start()
        return self

    def _loop(self) -> None:
        next_poll = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_poll:
                self.poll()
                next_poll = now + self.every
            if self.progress is not None:
                self.progress.update(*self.run_dir.latest())
            self._stop.wait(min(0.5, self.every))

    def poll(self) -> None:
        if self.servers is not None:
            self.servers.refresh(timeout=min(5.0, self.every * 2), cancel=self._stop)
        for server in (self.servers.live() if self.servers is not None else range(len(self.links))):
            links, index = self.servers.link(server) if self.servers is not None else (self.links, server)
            try:
                # A stop (the job ended or was stopped) ends the wait at once: a server stopped
                # before it ever answered would otherwise hold the launcher's exit for the deadline.
                stats = control.read_stats(links, index, timeout=min(5.0, self.every * 2), cancel=self._stop)
            except ParamshardError:
                continue                  # down, busy, stopping or garbled: the supervision loop reports dead servers
            now = time.time()
            before, then = self._before.get(server, (None, None))
            self.run_dir.server_record(server_record(stats, before, now, then))
            self._before[server] = (stats, now)
        known = [s for s, _ in (self._before.get(i, (None, None)) for i in range(len(self.links))) if s]
        if len(known) == len(self.links) and any(s.dense_blocks or s.tables for s in known):
            # The chief registers the model with one server after another: a poll between two
            # (a server still importing its libraries answers late) sees part of it. The plan is
            # written again while what the servers hold grows; moves of a scale change where the
            # model is, not how much of it there is, and do not rewrite it.
            held = (sum(s.dense_elements for s in known), frozenset(n for s in known for n in s.tables))
            if self._plan_held is None or (held[0] > self._plan_held[0] or held[1] > self._plan_held[1]):
                self.run_dir.write_plan(known)
                self._plan_held = held

    def stop(self) -> None:
        """Stop watching; the progress shows the last records once more (a short job ends
        before the plain progress's first line is due)."""
        self._stop.set()
        self._thread.join(timeout=10)
        if self.servers is not None:
            self.servers.close()
        if self.progress is not None:
            self.progress.update(*self.run_dir.latest(), force=True)
