"""Drive a change of server count in a running elastic job (PARAMSHARD_PARTITIONS > 0).

Starts and stops nothing: the launcher starts a new server process first (scale up) and
stops a removed one after (scale down); this moves the sparse partitions between them
(server/migration_service.py), in the background while the trainers train:

1. the new map (placement/partitions.rebalance: as few partitions as possible move);
2. new servers join (own nothing, get the tables), old owners start tracking, new owners
   hold requests for what comes to them;
3. the moving partitions' rows are copied in pages while the old owners keep serving;
4. partition group by group: server 0 publishes the routing naming the new owners, the old
   owner freezes them (refuses with ``moved``), hands over their current ids and the rows
   touched since the copy began, and the new owner takes them (its held requests run);
5. old owners drop what they handed away; a removed server owns nothing and is told to retire.

Dense blocks move in the same move (placement/block_map.rebalance_blocks: by bytes, few
blocks): the new owners expect them with the partitions, the first hand-off's routing names
their new owners, and each is frozen, exported whole (values, optimizer slots, version) and
imported right after it was published (server/dense_migration.py).

The move is returned as data (``MoveRecord``) for the run directory (observe/records.py).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import numpy as np

from ..checkpoint.turns import move_turn
from ..errors import ConfigError
from ..placement.block_map import rebalance_blocks
from ..placement.partitions import Routing, partition_of, rebalance
from ..transport.client import ServerLinks

PAGE_ROWS = 65536


@dataclasses.dataclass
class MoveRecord:
    """One move, as the run directory takes it (an event's details)."""
    servers_before: list[int]
    servers_after: list[int]
    started: float
    ended: float = 0.0
    partitions: int = 0
    rows: int = 0
    bytes: int = 0
    handoffs: int = 0
    longest_handoff_s: float = 0.0
    routing_version: int = 0
    copy_s: float = 0.0                 # the background copy of the pages
    handoffs_s: float = 0.0             # every hand-off together
    finish_s: float = 0.0               # old owners dropping what they handed away
    switch_step: int | None = None      # sync mode: the step at which the routing changed
    blocks: int = 0                     # dense blocks moved
    dense_bytes: int = 0                # their values and optimizer slots
    arm_tries: int = 0

    def details(self) -> dict:
        return {**dataclasses.asdict(self), "seconds": round(self.ended - self.started, 3)}


def scale_servers(env, addresses: Sequence[str], servers: Sequence[int], event: Callable | None = None,
                  **options) -> MoveRecord:
    """The launcher's call: after it started a new server process (scale up; ``addresses`` names it)
    or before it stops one (scale down; ``servers`` leaves it out). ``env``: a ClusterEnv with the
    job's security (PARAMSHARD_SECRET/keys, as `paramshard stats` reads them) and timeout.
    ``event``: RunDir.event, given ``scale_start`` and ``scale_end`` (the MoveRecord's details)."""
    from ..transport.security import Security
    addresses = list(addresses)
    if event is not None:
        event("scale_start", f"servers -> {sorted(servers)}", servers=sorted(servers))
    with ServerLinks(addresses, env.timeout, who="scaler", security=Security.from_env(env)) as links:
        links.wait_ready(env.timeout)
        record = move_partitions(links, addresses, servers, **options)
    if event is not None:
        event("scale_end", f"{record.partitions} partitions, {record.rows} rows moved in "
                           f"{record.ended - record.started:.2f} s", **record.details())
    return record


def move_partitions(links: ServerLinks, addresses: Sequence[str], servers: Sequence[int],
                    per_handoff: int = 16, page_rows: int = PAGE_ROWS,
                    clock: Callable[[], float] = time.time, switch_margin: int = 3) -> MoveRecord:
    """Give the job's sparse partitions to ``servers`` (indices into ``addresses``, every server the
    job ever had). ``links``: to those addresses (``ServerLinks``, the job's keys). New servers must
    be running; removed ones keep running until the launcher stops them (they own nothing)."""
    for index in range(len(links), len(addresses)):
        links.add_server(addresses[index])
    header, _ = links.request(0, {"op": "routing_get"})
    routing = Routing.from_wire(header["routing"])
    if not set(servers) <= set(range(len(addresses))):
        raise ConfigError(f"servers {sorted(servers)}: each must be an index into the {len(addresses)} addresses")
    if not routing.elastic:
        raise ConfigError("this job routes sparse ids by a fixed hash (PARAMSHARD_PARTITIONS=0): its servers "
                          "cannot change; start it with PARAMSHARD_PARTITIONS=1024 to scale it")
    if 0 not in servers:
        raise ConfigError("server 0 holds the job's routing and services: it cannot be removed")
    before = routing.servers()
    record = MoveRecord(before, sorted(servers), started=clock())
    address_list = list(routing.addresses) + list(addresses[len(routing.addresses):])
    for s in servers:
        address_list[s] = addresses[s]
    owners = rebalance(routing.owners, list(servers))
    moving = np.flatnonzero(owners != routing.owners)
    record.partitions = len(moving)
    blocks_now, new_blocks = _block_maps(links, routing, before, servers)
    dense_moves = {n: (blocks_now[n], s) for n, s in new_blocks.items() if s != blocks_now[n]}
    record.blocks = len(dense_moves)
    joined = [s for s in servers if s not in before]
    routing = routing.moved_to(routing.owners, version=routing.version, addresses=address_list, blocks=blocks_now)
    described = links.request(0, {"op": "migrate_tables"})[0]
    tables, sync = described["tables"], described["sync"]
    coming = {dest: dict.fromkeys((t["table"] for t in tables), 0.0) for dest in joined}   # rows, roughly
    for s in sorted(set(routing.owners[moving].tolist())):
        held = links.request(s, {"op": "migrate_start", "partitions": _ints(moving[routing.owners[moving] == s])})
        for dest in joined:
            share = int(((routing.owners == s) & (owners == dest)).sum()) / max(1, int((routing.owners == s).sum()))
            for table, rows in held[0]["rows"].items():
                coming[dest][table] = coming[dest].get(table, 0.0) + rows * share
    for s in joined:     # before any request can reach it: it owns nothing, has the tables, room for the rows
        links.request(s, {"op": "routing_set", "routing": routing.to_wire(), "join": True})
        links.request(s, {"op": "migrate_tables_in", "tables": [
            {**t, "reserve": int(coming[s].get(t["table"], 0) * 1.05)} for t in tables]})
    for s in sorted(set(owners[moving].tolist())):
        links.request(s, {"op": "migrate_expect", "partitions": _ints(moving[owners[moving] == s])})
    for s in sorted({dest for _, dest in dense_moves.values()}):
        links.request(s, {"op": "dense_expect", "names": sorted(n for n, (_, d) in dense_moves.items() if d == s)})
    began = time.monotonic()
    _copy(links, routing, owners, moving, [t["table"] for t in tables], page_rows, record)
    record.copy_s = time.monotonic() - began
    if sync and (len(moving) or dense_moves):
        # Sync: every trainer changes routing at one step S; all partitions are handed off
        # between the completion of step S - 1 and any push of step S (handoff_freeze waits).
        record.switch_step, record.arm_tries = _arm(links, sorted(set(servers) | set(before)), routing.version + 1,
                                                    margin=switch_margin)
        per_handoff = max(1, len(moving))
    groups = [moving[start:start + per_handoff] for start in range(0, len(moving), per_handoff)]
    if dense_moves and not groups:
        groups = [moving[:0]]
    # From the first hand-off to the final routing, checkpoints wait (and this waits for one in
    # progress): a checkpoint reads the routing before the hand-offs or the final one, never rows
    # half handed over (checkpoint/turns.py). Nothing in it waits for a trainer's next step.
    with move_turn(links, record.switch_step):
        final = _hand_offs(links, routing, owners, groups, tables, record, new_blocks, dense_moves, moving,
                           address_list, before, servers)
    # Old owners drop what they handed away (a checkpoint reads only the owners' rows and blocks,
    # and an old owner holds the drop while a checkpoint pages its rows: server/checkpoint_service.py).
    began = time.monotonic()
    for s in before:
        links.request(s, {"op": "migrate_finish"})
    for s in sorted({source for source, _ in dense_moves.values()}):
        links.request(s, {"op": "dense_finish"})
    record.finish_s = time.monotonic() - began
    for s in before:
        if s not in servers:
            links.request(s, {"op": "retire"})
    record.routing_version = final.version
    record.ended = clock()
    return record


def _hand_offs(links, routing, owners, groups, tables, record, new_blocks, dense_moves, moving,
               address_list, before, servers) -> Routing:
    for number, group in enumerate(groups):
        began = time.monotonic()
        # The first hand-off's routing names the blocks' new owners too; they move right after it.
        routing = _hand_off(links, routing, owners, group, [t["table"] for t in tables], record,
                            dense=(new_blocks, dense_moves) if number == 0 and dense_moves else None)
        record.handoffs += 1
        record.longest_handoff_s = max(record.longest_handoff_s, time.monotonic() - began)
        record.handoffs_s += time.monotonic() - began
    if len(moving) == 0 and routing.addresses != tuple(address_list):
        routing = routing.moved_to(routing.owners, addresses=address_list)
    final = routing.moved_to(owners, addresses=[a if (i in servers) else "" for i, a in enumerate(address_list)],
                             blocks=new_blocks)
    for s in sorted(set(servers) | set(before)):
        links.request(s, {"op": "routing_set", "routing": final.to_wire()})
    return final


def _arm(links, servers: list[int], version: int, margin: int, tries: int = 20) -> tuple[int, int]:
    """Sync: the step at which routing ``version`` takes over, armed on every server: ``margin``
    steps past the furthest table, later if a server says it is too close by then."""
    from ..errors import RemoteError
    for attempt in range(1, tries + 1):
        step = max(t["version"] for s in servers
                   for t in links.request(s, {"op": "migrate_tables"})[0]["tables"]) + margin
        try:
            for s in servers:
                links.request(s, {"op": "migrate_switch", "step": step, "version": version})
            return step, attempt
        except RemoteError as exc:
            if "too close" not in str(exc):
                raise
            margin += 2
    raise ConfigError(f"sync mode: could not find a step to change routing at after {tries} tries")


def _block_maps(links, routing: Routing, before: list[int], servers) -> tuple[dict, dict]:
    """(where each dense block is now, where it goes). Before the first move the routing has no
    block map: the servers say what they hold (the plan's placement)."""
    holders = sorted(set(before) | set(routing.blocks.values()))
    now, sizes = dict(routing.blocks), {}
    for s in holders:
        held = links.request(s, {"op": "dense_held"})[0]["blocks"]
        sizes.update(held)
        if not routing.blocks:
            now.update(dict.fromkeys(held, s))
    if set(now) != set(sizes):
        raise ConfigError(f"dense blocks {sorted(set(now) ^ set(sizes))[:3]} are not where the routing "
                          f"(version {routing.version}) says; is a move still under way?")
    if not now:
        return {}, {}
    return now, rebalance_blocks(now, sizes, list(servers))


def _hand_off_blocks(links, moves: dict, record: MoveRecord) -> None:
    """Freeze each moving block on its old owner, export it whole and import it on the new one."""
    for source in sorted({src for src, _ in moves.values()}):
        mine = sorted(n for n, (src, _) in moves.items() if src == source)
        links.request(source, {"op": "dense_freeze", "names": mine})
        for dest in sorted({moves[n][1] for n in mine}):
            names = [n for n in mine if moves[n][1] == dest]
            header, arrays = links.request(source, {"op": "dense_export", "names": names})
            fields = {k: header[k] for k in ("names", "versions", "slots", "optimizer", "plan_fingerprint")}
            links.request(dest, {"op": "dense_import", **fields, "lr_scale": float(header["lr_scale"])}, arrays)
            size = sum(a.nbytes for a in arrays)
            record.bytes += size
            record.dense_bytes += size


def _ints(a) -> list[int]:
    return [int(x) for x in a]


def _copy(links, routing: Routing, owners, moving, tables: list[str], page_rows: int, record: MoveRecord) -> None:
    """Every moving partition's rows, page by page, from its owner to its new one (staged there)."""
    for source in sorted(set(routing.owners[moving].tolist())):
        for table in tables:
            start = 0
            while True:
                header, arrays = links.request(source, {"op": "migrate_page", "table": table, "start": start,
                                                        "count": page_rows})
                _forward(links, routing.partitions, owners, "migrate_stage", table, header["parts"], arrays, record)
                start += page_rows
                if start >= header["total"]:
                    break


def _forward(links, partitions: int, owners, op: str, table: str, parts: list, arrays: list,
             record: MoveRecord, to: int | None = None, **fields) -> None:
    """A page's rows to the servers their partitions go to (or all of it to ``to``)."""
    named = dict(zip(parts, arrays))
    record.bytes += sum(a.nbytes for a in arrays)
    if to is not None:
        links.request(to, {"op": op, "table": table, "parts": list(parts), **fields}, arrays)
        return
    if not len(named["ids"]):
        return
    record.rows += len(named["ids"])
    dest = owners[partition_of(named["ids"], partitions)]
    for s in np.unique(dest).tolist():
        mine = dest == s
        links.request(s, {"op": op, "table": table, "parts": list(parts)}, [named[p][mine] for p in parts])


def _hand_off(links, routing: Routing, owners, group, tables: list[str], record: MoveRecord,
              dense: tuple | None = None) -> Routing:
    """Publish ``group`` at its new owners (server 0 first), then freeze, hand over and adopt it.
    ``dense``: (the new block map, the blocks moving), published and moved with this group."""
    new_owners = routing.owners.copy()
    new_owners[group] = owners[group]
    published = routing.moved_to(new_owners, blocks=dense[0] if dense else None)
    links.request(0, {"op": "routing_set", "routing": published.to_wire()})
    if dense:
        _hand_off_blocks(links, dense[1], record)
    for source in sorted(set(routing.owners[group].tolist())):
        mine = group[routing.owners[group] == source]
        links.request(source, {"op": "handoff_freeze", "partitions": _ints(mine)})
        for dest in sorted(set(owners[mine].tolist())):
            theirs = mine[owners[mine] == dest]
            for table in tables:
                header, arrays = links.request(source, {"op": "handoff_rows", "table": table,
                                                        "partitions": _ints(theirs)})
                record.rows += len(arrays[header["parts"].index("ids")])
                _forward(links, routing.partitions, owners, "handoff_in", table, header["parts"], arrays, record,
                         to=dest, version=header["version"])
            links.request(dest, {"op": "handoff_done", "partitions": _ints(theirs)})
    return published
