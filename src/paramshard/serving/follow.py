"""Which files of a delta directory (online/delta_log.py) a replica applies next, exactly once.

Each server's files are applied in seq order from where the replica is (``applied``: server ->
the seq of the last file applied; 0 for a server followed from its beginning). A delta with a seq
at or below it was applied already (a no-op); the next one must be seq + 1. A missing seq (a
*gap*: the file was pruned, or never written) can only be crossed by starting again from a
snapshot at or past it; with none, the server's following stops there and the replica keeps
serving what it has. Across servers, files are applied in order of their ``step`` (a row that
moved between servers takes its newer value last), each server's in seq order.
"""
from __future__ import annotations

import dataclasses
import heapq

from paramshard.online.delta_format import Delta, read_delta
from paramshard.online.delta_log import DeltaLog, Entry

MAX_FILES = 256        # files read by one poll (each is in memory until applied): the rest next poll


@dataclasses.dataclass
class Plan:
    """What to read next: each server's files in order; ``restart``: a snapshot must be started from
    (a gap it covers, or a server that appeared with one); ``gaps``: server -> why it stops."""
    files: dict[int, list[Entry]]
    restart: bool = False
    gaps: dict[int, str] = dataclasses.field(default_factory=dict)


def gap_message(log: DeltaLog, server: int, applied: int, found: int | None) -> str:
    where = log.server_dir(server)
    seen = f"the next file there is seq {found}" if found is not None else "no file follows it"
    return (f"server {server}: the replica applied seq {applied} and {seen} in {where}: delta {applied + 1} is "
            f"missing and no snapshot at or past it can be started from. The replica keeps serving the version it "
            f"has; it follows on once the server publishes a snapshot (or restart it on a directory whose "
            f"deltas are whole)")


def contiguous(entries: list[Entry], applied: int) -> tuple[list[Entry], int | None]:
    """The deltas of ``entries`` that follow ``applied`` without a gap; and the seq of the first one
    past a gap (None: no gap)."""
    out: list[Entry] = []
    expected = applied + 1
    for entry in entries:
        if entry.seq != expected:
            return out, entry.seq
        out.append(entry)
        expected += 1
    return out, None


def start_plan(log: DeltaLog) -> tuple[dict[int, Entry | None], Plan]:
    """Where to start each server (its latest snapshot, or None: from seq 0 with no rows) and the
    deltas after it."""
    bases, plan = {}, Plan({})
    for server in log.servers():
        snapshot = log.latest_snapshot(server)
        bases[server] = snapshot
        applied = snapshot.seq if snapshot else 0
        plan.files[server], missing = contiguous(log.deltas_after(server, applied), applied)
        if missing is not None and not plan.files[server]:
            plan.gaps[server] = gap_message(log, server, applied, missing)
    return bases, plan


def follow_plan(log: DeltaLog, applied: dict[int, int]) -> Plan:
    """The files each server published since ``applied``."""
    plan = Plan({})
    for server in log.servers():
        if server not in applied:
            if log.latest_snapshot(server) is not None:
                plan.restart = True          # a server joined: its rows come from its snapshot
                continue
            applied_seq = 0
        else:
            applied_seq = applied[server]
        entries = log.entries(server)
        if restarted(entries, applied_seq):
            plan.restart = True              # the server started again: its part comes from that snapshot
            continue
        deltas = [e for e in entries if e.kind == "delta" and e.seq > applied_seq]
        plan.files[server], missing = contiguous(deltas, applied_seq)
        if missing is not None and not plan.files[server]:
            snapshot = log.latest_snapshot(server)
            if snapshot is not None and snapshot.seq >= applied_seq + 1:
                plan.restart = True
            else:
                plan.gaps[server] = gap_message(log, server, applied_seq, missing)
    return plan


def restarted(entries: list[Entry], applied: int) -> bool:
    """Whether a snapshot past ``applied`` has no delta of its seq: a server started again in place
    writes one to say "this server's part starts again from here" (online/delta_log.py)."""
    deltas = {e.seq for e in entries if e.kind == "delta"}
    return any(e.kind == "snapshot" and e.seq > applied and e.seq not in deltas for e in entries)


def read_in_order(files: dict[int, list[Entry]], limit: int = MAX_FILES) -> list[Delta]:
    """The files read (checked: online/delta_format.py) and merged across servers by the time each was written, each
    server's kept in seq order; at most ``limit`` (the first ones of that order). DeltaError for a
    damaged file or one whose header names another server or seq than its name."""
    heads: list[tuple[float, int, int, Delta]] = []
    queues = {server: list(entries) for server, entries in files.items() if entries}

    def push(server):
        entry = queues[server].pop(0)
        delta = read_delta(entry.path)
        check_named(delta, server, entry)
        heapq.heappush(heads, (delta.created, server, delta.seq, delta))

    for server in queues:
        push(server)
    out: list[Delta] = []
    while heads and len(out) < limit:
        _, server, _, delta = heapq.heappop(heads)
        out.append(delta)
        if queues[server]:
            push(server)
    return out


def check_named(delta: Delta, server: int, entry: Entry) -> None:
    from paramshard.online.delta_format import DeltaError
    if delta.server != server or delta.seq != entry.seq or delta.kind != entry.kind:
        raise DeltaError(f"{entry.path}: its header says {delta.kind} seq {delta.seq} of server {delta.server}, its "
                         f"name {entry.kind} seq {entry.seq} of server {server}: a file copied or renamed by hand")
