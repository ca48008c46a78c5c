"""The launcher's watcher: asks every server for its counters every few seconds,
turns them into server records (rates since the last ask), writes the plan once
the chief registered, and drives the live progress.

It is a client like the trainers (same keys), asking only ``stats``, which
every server answers at once; a server that does not answer is skipped this
time (the launcher's own supervision reports dead processes).
"""
from __future__ import annotations

import threading
import time

from ..errors import ParamshardError
from ..log import get_logger
from .records import SERVER_EVERY

log = get_logger("launch")
PUSH_OPS = ("push_dense", "push_sparse")


def server_record(stats: dict, before: dict | None, now: float, then: float | None) -> dict:
    """One server's record from its ``stats`` reply, with rates against the previous one."""
    phases, old_phases = stats.get("phase_seconds", {}), (before or {}).get("phase_seconds", {})
    dt = (now - then) if then else None
    requests = stats.get("requests", 0)
    pushes = sum(stats.get(f"op_{op}", 0) for op in PUSH_OPS)
    old_pushes = sum((before or {}).get(f"op_{op}", 0) for op in PUSH_OPS)
    update = sum(phases.get(op, 0.0) for op in PUSH_OPS) - sum(old_phases.get(op, 0.0) for op in PUSH_OPS)
    waited = stats.get("deferred_wait_s", 0.0) - (before or {}).get("deferred_wait_s", 0.0)
    answered = stats.get("deferred_answered", 0) - (before or {}).get("deferred_answered", 0)
    return {
        "kind": "server", "t": now, "server": stats["server"],
        "rows": stats.get("sparse_rows", 0), "elements": stats.get("dense_elements", 0),
        "bytes_in": stats.get("bytes_in", 0), "bytes_out": stats.get("bytes_out", 0), "requests": requests,
        "requests_per_s": round((requests - (before or {}).get("requests", 0)) / dt, 2) if dt else None,
        "queue_s": round(waited / answered, 6) if answered > 0 else 0.0,
        "update_s": round(update / (pushes - old_pushes), 6) if pushes > old_pushes else None,
        "staleness": stats.get("staleness") or {},
        "live_trainers": len(stats.get("trainers", {}).get("live", [])),
    }


class Monitor:
    def __init__(self, run_dir, links, progress=None, every: float = SERVER_EVERY):
        self.run_dir, self.links, self.progress, self.every = run_dir, links, progress, every
        self._stop = threading.Event()
        self._before: dict[int, tuple[dict, float]] = {}
        self._plan_written = False
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
        for server in range(len(self.links)):
            try:
                ticket = self.links.submit([(server, {"op": "stats"}, ())], timeout=min(5.0, self.every * 2))
                # A stop (the job ended or was stopped) ends the wait at once: a server stopped
                # before it ever answered would otherwise hold the launcher's exit for the deadline.
                [(header, _)] = self.links.collect(ticket, cancel=self._stop)
            except ParamshardError:
                continue                  # down, busy or stopping: the supervision loop reports dead servers
            stats = header["stats"]
            now = time.time()
            before, then = self._before.get(server, (None, None))
            self.run_dir.server_record(server_record(stats, before, now, then))
            self._before[server] = (stats, now)
        stats = [s for s, _ in (self._before.get(i, (None, None)) for i in range(len(self.links))) if s]
        if not self._plan_written and len(stats) == len(self.links) and any(s.get("dense_blocks") or s.get("tables")
                                                                            for s in stats):
            self.run_dir.write_plan(stats)
            self._plan_written = True

    def stop(self) -> None:
        """Stop watching; the progress shows the last records once more (a short job ends
        before the plain progress's first line is due)."""
        self._stop.set()
        self._thread.join(timeout=10)
        if self.progress is not None:
            self.progress.update(*self.run_dir.latest(), force=True)
