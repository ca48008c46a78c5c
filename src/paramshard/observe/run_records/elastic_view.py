"""What an elastic job's run directory says about its membership, its moves and its
stalls: pure functions over the parsed records (run_data.RunData), for the report's
"Elastic job" section and membership.png.

Events (observe/run_records/records.py) an elastic job writes:
- ``membership``: ``role`` (trainer | server), ``rank``, ``change`` (joined, left, lost,
  replaced, added, removed, asked to leave), ``live`` (that role's count after it);
- ``scale_end``: rows moved between servers (launch/server_scaling.MoveRecord:
  ``servers_before``, ``servers_after``, ``partitions``, ``rows``, ``bytes``, ``seconds``),
  recorded when the move ended (``t``); ``move`` events of the same shape with ``servers``;
- ``recovery``: a killed server serving again (``rank``, ``seconds``, ``lost_updates``), and
  the bounded-loss replica keeper's ``replica`` events (``what: restored``, ``recovery_s``,
  ``updates_lost_estimate``).
Trainers' records carry ``step_max_s``: the longest wall time of one step since their
previous record, which is what a stall is (a trainer waiting on a move or a lost peer), and
``step_end_t``: when their last step ended, so the steps of a record lie between the previous
record's ``step_end_t`` and its own. A trainer's last record marked ``done`` was written as it
closed; a trainer whose records stop without one (stuck at a move, then killed or stopped
with the job) is in a step that never ended: from its last step's end to when it was lost or
left, else to the job's end. That open step counts for the moves it overlaps (a trainer stuck
at the last move writes nothing more, and its 65 s stall would otherwise not show).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

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
        first = start.get(role)
        points: list[tuple[float, int]] = [(0.0, first)] if first is not None else []
        for e in membership_events(events):
            live = _count(e.get("live"))
            if e["role"] == role and live is not None:
                points.append((e["t"] - t0, live))
        if points and t_end is not None and t_end - t0 > points[-1][0]:
            points.append((t_end - t0, points[-1][1]))
        if points:
            out[role] = points
    return out


SLOW_STEP_S = 1.0      # a trainer step longer than this during a move is flagged in the report
ENDS = ("left", "lost", "replaced")     # membership changes after which a trainer's process is gone


@dataclass(frozen=True)
class Move:
    started: float         # seconds since t0
    seconds: float
    servers: str
    partitions: int | None
    rows: int | None
    bytes: int | None
    longest_step: float | None    # the longest trainer step that overlapped the move
    # (trainer, its longest step) for each trainer with a step over SLOW_STEP_S overlapping it
    slow: tuple[tuple[int, float], ...] = ()


def job_end(summary: dict | None, events: list[dict], trainers: dict[int, list[dict]]) -> float | None:
    """When the job ended: summary.json's ``ended``, else its ``end`` event, else the latest
    time the run directory knows (a job still running, or whose launcher was killed)."""
    ended = _number(summary.get("ended")) if isinstance(summary, dict) else None
    if ended is not None:
        return ended
    ends = [e["t"] for e in events if e.get("event") == "end" and _number(e.get("t")) is not None]
    if ends:
        return ends[-1]
    times = [r["t"] for r in (*events, *(r for rs in trainers.values() for r in rs)) if _number(r.get("t")) is not None]
    return max(times) if times else None


def _gone_at(events: list[dict], trainer: int, after: float) -> float | None:
    """When trainer ``trainer``'s process was lost or left after ``after`` (membership events)."""
    for e in membership_events(events):
        if e["role"] == "trainer" and e.get("change") in ENDS and e["t"] >= after and \
                (e.get("trainer") == trainer or e.get("rank") == f"trainer {trainer}"):
            return e["t"]
    return None


def step_windows(trainers: dict[int, list[dict]], events: Sequence[dict] = (),
                 ended: float | None = None) -> list[tuple[int, float, float, float]]:
    """(trainer, start, end, longest step) of each stretch of a trainer's steps: a record's steps
    ended after the previous record's last one (its ``step_end_t``; the record's time in records
    without one) and by its own; its longest (``step_max_s``) lies in there. Then, for a trainer
    whose records stop without ``done``, the step it never finished (see the module's doc)."""
    out = []
    for trainer, records in trainers.items():
        previous = None
        for r in records:
            longest = _number(r.get("step_max_s"))
            end = _number(r.get("step_end_t"))
            end = _number(r.get("t")) if end is None else end
            if end is None:
                continue
            if longest is not None:
                out.append((trainer, end - longest if previous is None else min(previous, end - longest), end, longest))
            previous = end
        last = records[-1] if records else {}
        began = _number(last.get("step_end_t"))
        if began is None:          # no step yet, or records from before steps were timed
            continue
        stop = _number(last.get("t")) if last.get("done") else _gone_at(list(events), trainer, began)
        stop = ended if stop is None else stop
        if stop is not None and stop > began:
            out.append((trainer, began, stop, stop - began))
    return out


def moves(events: list[dict], trainers: dict[int, list[dict]], t0: float, ended: float | None = None) -> list[Move]:
    """Each move of partitions with the longest trainer step that overlapped it (a step within a
    stretch that overlaps the move is counted: it can only overstate a stall, by a record's second
    at most) and the trainers with a step over SLOW_STEP_S then. ``ended``: the job's end
    (job_end), up to which a step a trainer never finished lasts."""
    windows = step_windows(trainers, events, ended)
    out = []
    for e in events:
        seconds = _number(e.get("seconds"))
        if e.get("event") not in ("move", "scale_end") or _number(e.get("t")) is None or seconds is None:
            continue
        begin, end = e["t"] - seconds, e["t"]
        during = [(trainer, length) for trainer, a, b, length in windows if a <= end and b >= begin]
        slow: dict[int, float] = {}
        for trainer, length in during:
            if length > SLOW_STEP_S:
                slow[trainer] = max(length, slow.get(trainer, 0.0))
        servers = e.get("servers") if "servers" in e else [e.get("servers_before"), e.get("servers_after")]
        out.append(Move(begin - t0, seconds, "->".join(map(str, servers)) if isinstance(servers, list)
                        else str(servers or "?"), _count(e.get("partitions")), _count(e.get("rows")),
                        _count(e.get("bytes")), max(length for _, length in during) if during else None,
                        tuple(sorted(slow.items()))))
    return out


def longest_steps(trainers: dict[int, list[dict]], events: Sequence[dict] = (),
                  ended: float | None = None) -> dict[int, float]:
    """Each trainer's longest step over the run (its worst stall), where recorded, a step it
    never finished included (step_windows)."""
    out: dict[int, float] = {}
    for trainer, _, _, length in step_windows(trainers, events, ended):
        out[trainer] = max(length, out.get(trainer, 0.0))
    return out


def recoveries(events: list[dict]) -> list[dict]:
    """Servers serving again after a kill: ``recovery`` events, and the replica keeper's
    restores (``replica`` events with ``what: restored``: launch/elastic/replica_keeper.py), as
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
