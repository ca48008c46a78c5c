"""What an elastic job's run directory says about its membership, its moves and its
stalls: pure functions over the parsed records (run_data.RunData), for the report's
"Elastic job" section and membership.png.

Events (observe/records.py) an elastic job writes:
- ``membership``: ``role`` (trainer | server), ``rank``, ``change`` (joined, left, lost,
  replaced, added, removed, asked to leave), ``live`` (that role's count after it);
- ``scale_end``: rows moved between servers (launch/server_scaling.MoveRecord:
  ``servers_before``, ``servers_after``, ``partitions``, ``rows``, ``bytes``, ``seconds``),
  recorded when the move ended (``t``); ``move`` events of the same shape with ``servers``;
- ``recovery``: a killed server serving again (``rank``, ``seconds``, ``lost_updates``), and
  the bounded-loss replica keeper's ``replica`` events (``what: restored``, ``recovery_s``,
  ``updates_lost_estimate``).
Trainers' records carry ``step_max_s``: the longest wall time of one step since their
previous record, which is what a stall is (a trainer waiting on a move or a lost peer).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

ROLES = ("trainer", "server")


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def initial_counts(config: dict | None) -> dict[str, int | None]:
    """How many trainers and servers the job started with, from config.json's launch
    configuration (None where it does not say)."""
    launch = config.get("launch") if isinstance(config, dict) else None
    launch = launch if isinstance(launch, dict) else {}
    return {"trainer": _count(launch.get("trainers")), "server": _count(launch.get("servers"))}


def membership_events(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("event") == "membership" and e.get("role") in ROLES
            and _number(e.get("t")) is not None]


def membership_series(events: list[dict], start: dict[str, int | None], t0: float,
                      t_end: float | None = None) -> dict[str, list[tuple[float, int]]]:
    """Per role, [(seconds since t0, live count)] as a step function: the starting count
    at 0, then each change's ``live``; the last count held to ``t_end``. A role with no
    starting count and no event is left out."""
    out: dict[str, list[tuple[float, int]]] = {}
    for role in ROLES:
        points = [(0.0, start[role])] if start.get(role) is not None else []
        for e in membership_events(events):
            live = _count(e.get("live"))
            if e["role"] == role and live is not None:
                points.append((e["t"] - t0, live))
        if points and t_end is not None and t_end - t0 > points[-1][0]:
            points.append((t_end - t0, points[-1][1]))
        if points:
            out[role] = points
    return out


@dataclass(frozen=True)
class Move:
    started: float         # seconds since t0
    seconds: float
    servers: str
    partitions: int | None
    rows: int | None
    bytes: int | None
    longest_step: float | None    # the longest trainer step that overlapped the move


def _step_spans(trainers: dict[int, list[dict]]) -> list[tuple[float, float]]:
    """(start, end) of each trainer record's longest step, placed as late as it can be:
    it ended at most at the record's time."""
    spans = []
    for records in trainers.values():
        for r in records:
            longest = _number(r.get("step_max_s"))
            if longest is not None:
                spans.append((r["t"] - longest, r["t"]))
    return spans


def moves(events: list[dict], trainers: dict[int, list[dict]], t0: float) -> list[Move]:
    spans = _step_spans(trainers)
    out = []
    for e in events:
        seconds = _number(e.get("seconds"))
        if e.get("event") not in ("move", "scale_end") or _number(e.get("t")) is None or seconds is None:
            continue
        begin, end = e["t"] - seconds, e["t"]
        # A record's step_max_s is the longest step of a whole second or so: a record
        # overlapping the move is counted, which can only overstate the stall.
        longest = [length for (a, b) in spans if a <= end and b >= begin for length in [b - a]]
        servers = e.get("servers") if "servers" in e else [e.get("servers_before"), e.get("servers_after")]
        out.append(Move(begin - t0, seconds, "->".join(map(str, servers)) if isinstance(servers, list)
                        else str(servers or "?"), _count(e.get("partitions")), _count(e.get("rows")),
                        _count(e.get("bytes")), max(longest) if longest else None))
    return out


def longest_steps(trainers: dict[int, list[dict]]) -> dict[int, float]:
    """Each trainer's longest step over the run (its worst stall), where recorded."""
    out = {}
    for trainer, records in trainers.items():
        values = [v for v in (_number(r.get("step_max_s")) for r in records) if v is not None]
        if values:
            out[trainer] = max(values)
    return out


def recoveries(events: list[dict]) -> list[dict]:
    """Servers serving again after a kill: ``recovery`` events, and the replica keeper's
    restores (``replica`` events with ``what: restored``: launch/replica_keeper.py), as
    {t, rank, seconds, lost_updates, text}."""
    out = []
    for e in events:
        if _number(e.get("t")) is None:
            continue
        if e.get("event") == "recovery":
            out.append(e)
        elif e.get("event") == "replica" and e.get("what") == "restored":
            out.append({"t": e["t"], "rank": f"server {e.get('server', '?')}", "seconds": e.get("recovery_s"),
                        "lost_updates": e.get("updates_lost_estimate"), "text": e.get("text", "")})
    return out


def is_elastic(events: list[dict]) -> bool:
    return any(e.get("event") in ("membership", "move", "scale_end", "recovery") for e in events) or \
        bool(recoveries(events))
