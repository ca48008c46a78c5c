"""Bounded-loss recovery, launcher side: a copy of every server, a few times a second.

With ``--recovery bounded-loss`` (async mode) the launcher runs a ReplicaKeeper: a
thread with its own links to the servers (the job's keys, as ``paramshard stats``
has) that asks each server for ``replica_delta`` every REFRESH_PERIOD seconds
(server/elastic/replication.py: a whole copy first, then what changed) and folds the
answers into a ServerReplica (launch/elastic/replica_copy.py).

A server that answers in epoch -1 was restarted in place (by the launcher's
``--max-restarts``): the keeper never copies it, it restores the replica onto it
(register_sparse, restore_dense, restore_sparse, then ``replica_resume`` into the
job's epoch) and the trainers, which wait for the server to serve again
(transport/links.py), resend what failed. Lost: the pushes the dead server applied
after its last copy, at most REFRESH_PERIOD plus one refresh's time of them.

Elastic jobs (``--partitions P``: servers added and removed while they run): the keeper
follows the job's routing, read from server 0 every round. A server the routing names for the
first time (one a scale added, from its first hand-off on) is copied from then on; a server it
names retired (empty address: a scale removed it, it holds nothing) is no longer copied nor
waited for. A restore first sends the routing the keeper read last (``routing_set`` with
``restored``), so the restarted server owns the partitions it held when it died, not those of
the job's first map; server 0 restored gets the job's routing back that way too.

Recorded among the run directory's events (``kind: event``, ``event: replica``):
the first whole copy, a summary of the refreshes every SUMMARY_EVERY seconds
(count, median seconds and bytes, longest gap between two copies of a server),
a server lost, and each restore with its time and the updates estimated lost.
"""
from __future__ import annotations

import statistics
import threading
import time
from typing import Callable, Sequence

from paramshard.errors import DeadlineExceeded, ParamshardError, ServerUnavailable
from paramshard.log import get_logger
from paramshard.transport.links import ServerLinks
from paramshard.launch.elastic.replica_copy import ServerReplica

log = get_logger("launch")

REFRESH_PERIOD = 0.25        # seconds between two copies of a server: at most ~this much is lost
SUMMARY_EVERY = 10.0         # seconds between two refresh summaries in the run directory


class ReplicaKeeper:
    def __init__(self, addresses: Sequence[str], timeout: float, security=None,
                 record: Callable[..., None] | None = None, period: float = REFRESH_PERIOD, links=None,
                 partitions: int = 0):
        """``record(event, text, **fields)``: where events go (the run directory's ``RunDir.event``).
        ``links``: anything with ServerLinks' submit / collect / request / close (tests), and
        add_server for an elastic job. ``partitions``: the job's (PARAMSHARD_PARTITIONS); > 0: follow
        its routing."""
        self.links = links or ServerLinks(addresses, timeout, who="launcher (replica keeper)", security=security)
        self.elastic = partitions > 0
        self.routing: dict | None = None                    # the job's routing as last read (wire form)
        self.retired: set[int] = set()                      # servers a scale removed: not copied
        self.period, self.timeout = period, timeout
        self.record = record or (lambda *a, **k: None)
        n = len(addresses)
        self.replicas = [ServerReplica() for _ in range(n)]
        self.copied_at: list[float | None] = [None] * n     # monotonic time of each server's latest copy
        self._rate = [0.0] * n                              # pushes a second, between its last two copies
        self._since = [-1] * n                              # each server's last reply folded in (-1: none)
        self.lost_at: dict[int, float] = {}                 # server -> when its copy first failed
        self.restores: list[dict] = []                      # what each restore recorded
        self._log: list[tuple[float, int]] = []             # (seconds, bytes) of refreshes since the summary
        self._gaps = [0.0] * n                              # longest time between two copies, since the summary
        self._summary_at = time.monotonic()
        self._nothing_to_restore: set[int] = set()
        self._restarted: set[int] = set()                   # servers the launcher restarted, not restored yet
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_env(cls, env, record=None) -> "ReplicaKeeper":
        from paramshard.transport.security import Security
        return cls(env.servers, env.timeout, Security.from_env(env), record, partitions=env.partitions or 0)

    @property
    def followed(self) -> list[int]:
        """The servers copied: every server of the job but those a scale removed."""
        return [s for s in range(len(self.replicas)) if s not in self.retired]

    def follow_routing(self) -> None:
        """Elastic jobs: read server 0's routing; take the servers it names for the first time, stop
        copying those it names retired. Server 0 unreachable (dead, restarting): keep the last read."""
        from paramshard.placement.partitions import Routing
        try:
            header, _ = self.links.request(0, {"op": "routing_get"}, timeout=min(self.timeout, 2.0))
            routing = Routing.from_wire(header["routing"])
        except ParamshardError:
            return
        if self.routing is not None and routing.version < self.routing["version"]:
            return          # a restarted server 0 not restored yet: its first map is not the job's
        for index in range(len(self.replicas), len(routing.addresses)):
            # A server added and removed again between two reads keeps its index with a placeholder
            # link (""): the links' indices are the job's server indices.
            self.links.add_server(routing.addresses[index])
            self.replicas.append(ServerReplica())
            self.copied_at.append(None)
            self._rate.append(0.0)
            self._since.append(-1)
            self._gaps.append(0.0)
            if routing.addresses[index]:
                log.info("replica keeper: server %d joined the job; copying it", index)
        for index, address in enumerate(routing.addresses):
            if not address and index not in self.retired:
                self.retired.add(index)
                self.links.retire(index)          # it exits once the trainers route without it
                self.lost_at.pop(index, None)
                log.info("replica keeper: server %d left the job; no longer copied", index)
                self.record("replica", f"server {index} left the job: no longer copied", server=index,
                            what="retired")
        self.routing = routing.to_wire()

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> "ReplicaKeeper":
        self._thread = threading.Thread(target=self._run, name="replica keeper", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.timeout + 5)
        self._summarize(force=True)
        self.links.close()

    def latest(self):
        """A marker when every server has a whole copy of a registered model (the restart policy's
        "something to restore"), else None: a copy from before the chief registered restores nothing."""
        from pathlib import Path
        return Path("replica") if all(self._restorable(s) for s in self.followed) else None

    def _restorable(self, server: int) -> bool:
        """A whole copy of ``server`` with the registered model: its dense blocks, unless the job's
        block map (a scale moved blocks) places none on it."""
        replica = self.replicas[server]
        if not replica.complete:
            return False
        routing = self.routing or {}
        holds_none = bool(routing.get("blocks")) and server not in _block_servers(routing)
        return replica.dense is not None or (holds_none and any(self.replicas[s].dense is not None
                                                                for s in self.followed))

    def note_lost(self, server: int, at: float) -> None:
        """The launcher saw ``server`` die at ``at`` (monotonic): loss and recovery count from then."""
        self.lost_at[server] = min(at, self.lost_at.get(server, at))
        self._restarted.add(server)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            if self.elastic:
                self.follow_routing()
            # Every server's first request goes out at once: one slow server does not age the others' copies.
            asked = {s: self._ask(s) for s in self.followed}
            for server, ticket in asked.items():
                if self._stop.is_set():
                    return
                try:
                    self.refresh(server, ticket)
                except Exception:      # noqa: BLE001 - a bug here must not end the copies of every server
                    log.exception("replica keeper: copying server %d failed", server)
                    self._since[server] = -1
            self._summarize()
            # A lost server is looked at more often: its replacement is restored as soon as it answers.
            period = min(self.period, 0.05) if self.lost_at else self.period
            self._stop.wait(max(0.0, period - (time.monotonic() - started)))

    # -- one server ---------------------------------------------------------------
    def _ask(self, server: int):
        try:
            return self.links.submit([(server, {"op": "replica_delta", "since": self._since[server]}, ())],
                                     timeout=min(self.timeout, 10.0))
        except ParamshardError as exc:
            return exc

    def refresh(self, server: int, ticket=None) -> None:
        """Copy what changed on ``server`` (``ticket``: its request, already sent); restore onto it if it
        was restarted."""
        started = time.monotonic()
        replica, size = self.replicas[server], 0
        before = replica.applied_updates()
        ticket = ticket if ticket is not None else self._ask(server)
        try:
            while True:
                if isinstance(ticket, Exception):
                    raise ticket
                [(header, arrays)] = self.links.collect(ticket)
                if header["epoch"] == -1:          # restarted in place, empty: never copy it, restore it
                    if self._restorable(server):
                        self.restore(server)
                    elif server not in self._nothing_to_restore:
                        self._nothing_to_restore.add(server)
                        log.error("replica keeper: server %d was restarted before the keeper had a whole copy "
                                  "of its model: nothing to restore; its trainers will time out", server)
                    return
                self._since[server] = -1           # until this reply is folded in
                size += replica.apply(header, arrays)
                self._since[server] = header["seq"]
                if not header.get("more"):
                    break
                ticket = self._ask(server)      # more pages wait: at once
        except (ServerUnavailable, DeadlineExceeded) as exc:
            if server not in self.lost_at:
                self.lost_at[server] = started
                copied = self.copied_at[server]
                age = started - copied if copied is not None else None
                text = f"server {server} unreachable ({type(exc).__name__}); its copy is {_s(age)} old"
                log.warning("replica keeper: %s", text)
                self.record("replica", text, server=server, what="lost", copy_age_s=age)
            return
        except ParamshardError as exc:
            self._since[server] = -1
            log.error("replica keeper: server %d: %s", server, exc)
            return
        now = time.monotonic()
        if server in self.lost_at and server not in self._restarted:   # answered again: only a slow moment
            del self.lost_at[server]
            self.record("replica", f"server {server} answers again", server=server, what="back")
        last = self.copied_at[server]
        if last is not None:
            self._gaps[server] = max(self._gaps[server], now - last)
            self._rate[server] = max(0, replica.applied_updates() - before) / max(now - last, 1e-6)
        elif replica.complete:
            self.record("replica", f"server {server}: first whole copy, {size} bytes in {now - started:.3f} s",
                        server=server, what="first", bytes=size, seconds=now - started)
        self.copied_at[server] = now
        self._log.append((now - started, size))

    def restore(self, server: int) -> None:
        """Put ``server``'s replica onto its restarted process and let it serve again."""
        began = time.monotonic()
        replica = self.replicas[server]
        lost_at = self.lost_at.get(server, began)
        copied = self.copied_at[server]
        # A copy answered just before the death may be folded in just after it: age 0, not negative.
        age = max(0.0, lost_at - copied) if copied is not None else None
        try:
            if self.routing is not None:       # the partitions it owned, before its rows come back
                self.links.request(server, {"op": "routing_set", "routing": self.routing, "restored": True},
                                   timeout=self.timeout)
            for header, arrays in replica.restore_requests():
                self.links.request(server, header, arrays, timeout=self.timeout)
        except ParamshardError as exc:
            text = f"server {server}: restoring its replica failed: {exc}"
            log.error("replica keeper: %s", text)
            self.record("replica", text, server=server, what="restore failed")
            return
        done = time.monotonic()
        # The dead server applied pushes after its last copy, at the rate of its last two copies.
        estimate = round(self._rate[server] * age) if age is not None else None
        streams = max(1, len(replica.steps))          # dense, and each table: a trainer step pushes to each
        entry = {"server": server, "what": "restored", "recovery_s": round(done - lost_at, 3),
                 "restore_s": round(done - began, 3), "copy_age_s": None if age is None else round(age, 3),
                 "updates_lost_estimate": estimate, "updates_in_copy": replica.applied_updates(),
                 "steps_lost_estimate": None if estimate is None else round(estimate / streams, 1)}
        self.restores.append({**entry, "steps": replica.steps})
        text = (f"server {server} serves again from its replica {done - lost_at:.2f} s after it was lost "
                f"(restore {done - began:.2f} s); the copy was {_s(age)} old: about {estimate} updates lost "
                f"(about {entry['steps_lost_estimate']} trainer steps)")
        log.warning("replica keeper: %s", text)
        self.record("replica", text, **entry)
        self.lost_at.pop(server, None)
        self._restarted.discard(server)
        self._since[server] = -1
        self.copied_at[server] = None

    def _summarize(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self._log or (not force and now - self._summary_at < SUMMARY_EVERY):
            return
        seconds, sizes = zip(*self._log)
        gap = max(self._gaps)
        self.record("replica", f"{len(self._log)} refreshes in {now - self._summary_at:.0f} s: median "
                    f"{statistics.median(seconds) * 1000:.1f} ms, {statistics.median(sizes)} bytes; longest gap "
                    f"between two copies of a server {gap:.2f} s", what="refreshes", count=len(self._log),
                    median_s=statistics.median(seconds), median_bytes=statistics.median(sizes),
                    max_bytes=max(sizes), longest_gap_s=gap)
        self._log, self._gaps, self._summary_at = [], [0.0] * len(self._gaps), now


def _block_servers(wire: dict) -> set[int]:
    """The servers a routing's block map (its checked wire form) places dense blocks on."""
    return set(wire.get("blocks", {}).values())


def _s(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds:.2f} s"
