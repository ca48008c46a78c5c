"""Drive a change of server count in a running elastic job (PARAMSHARD_PARTITIONS > 0).

Starts and stops nothing: the launcher starts a new server process first (scale up) and
stops a removed one after (scale down). The move itself is a pure state machine
(placement/move_plan.py: which wire requests to send, in which order, and the clean abort
when one fails) driven over ServerLinks by client/move_runner.py; these are the launcher's
and the tests' entry points. The move is returned as data (``MoveRecord``) for the run
directory (observe/run_records/records.py); a move that fails raises ``MoveFailed`` naming the server and
the step, after the plan undid what it could (docs/DESIGN.md section 5f).
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

from paramshard.client.move_runner import connect_all, run_move
from paramshard.placement.move_plan import PAGE_ROWS, MoveFailed, MovePlan, MoveRecord
from paramshard.transport.links import ServerLinks

__all__ = ["MoveFailed", "MoveRecord", "PAGE_ROWS", "move_partitions", "scale_servers"]


def scale_servers(env, addresses: Sequence[str], servers: Sequence[int], event: Callable | None = None,
                  **options) -> MoveRecord:
    """The launcher's call: after it started a new server process (scale up; ``addresses`` names it)
    or before it stops one (scale down; ``servers`` leaves it out). ``env``: a ClusterEnv with the
    job's security (PARAMSHARD_SECRET/keys, as `paramshard stats` reads them) and timeout.
    ``event``: RunDir.event, given ``scale_start`` and ``scale_end`` (the MoveRecord's details), or
    ``scale_failed`` (the server and the step at fault) before a MoveFailed is raised."""
    from paramshard.transport.security import Security
    addresses = list(addresses)
    if event is not None:
        event("scale_start", f"servers -> {sorted(servers)}", servers=sorted(servers))
    with ServerLinks(addresses, env.timeout, who="scaler", security=Security.from_env(env)) as links:
        links.wait_ready(env.timeout)
        try:
            record = move_partitions(links, addresses, servers, **options)
        except MoveFailed as failed:
            if event is not None:       # the run directory says why the servers did not change
                event("scale_failed", str(failed), server=failed.step.server, op=failed.step.op,
                      undone=failed.undone, moved=failed.moved, in_doubt=failed.in_doubt[:16])
            raise
    if event is not None:
        event("scale_end", f"{record.partitions} partitions, {record.rows} rows moved in "
                           f"{record.ended - record.started:.2f} s", **record.details())
    return record


def move_partitions(links: ServerLinks, addresses: Sequence[str], servers: Sequence[int],
                    per_handoff: int = 16, page_rows: int = PAGE_ROWS,
                    clock: Callable[[], float] = time.time, switch_margin: int = 3,
                    timeout: float | None = None) -> MoveRecord:
    """Give the job's sparse partitions to ``servers`` (indices into ``addresses``, every server the
    job ever had). ``links``: to those addresses (``ServerLinks``, the job's keys). New servers must
    be running; removed ones keep running until the launcher stops them (they own nothing).
    ``timeout``: each step's deadline (default: the links'); a step refused or not answered in it
    aborts the move (MoveFailed)."""
    connect_all(links, addresses)
    plan = MovePlan(addresses, servers, per_handoff=per_handoff, page_rows=page_rows,
                    switch_margin=switch_margin, clock=clock)
    return run_move(links, plan, timeout)
