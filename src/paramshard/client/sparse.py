"""Trainer side of the sparse-table requests (server side: paramshard.server.services.sparse_service).

Ids are owned by servers through a stable hash (paramshard.placement.sparse_hash), so
every trainer sends each id to the same server whatever the table. In an elastic job
(PARAMSHARD_PARTITIONS) the hash names a virtual partition and a versioned routing its
server (placement/partitions.py): a request refused as ``moved`` (its partition went to
another server) is split again under the newest routing this trainer knows and sent again,
only that part (``settle``). Server 0 is asked for a newer routing only when the trainer
knows none newer than the one the refused request was sent under (its header's
``routing``): a pull may have fetched the move's last routing while a push sent under an
older one was in flight, and that push must not wait for a routing that never comes. A
server the routing names for the first time is connected then; one it names retired ("")
is never connected to (transport/links.ServerLinks.retire).
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from paramshard.budgets import parse_budget
from paramshard.errors import ConfigError, DeadlineExceeded, ProtocolError
from paramshard.optim import OptimizerConfig
from paramshard.placement.partitions import Routing
from paramshard.tables import Admission, Eviction, check_row_format, check_table_settings, policy_to_wire
from paramshard.transport.links import ServerLinks

# How long a request refused as ``moved`` under the routing server 0 still publishes waits for a
# newer one. Server 0 publishes each hand-off's routing before the old owner refuses anything, so
# in a move that works the newer routing is there at once (a sync switch armed just before it is
# published takes a few requests more); a refusal under the current routing that outlasts this is a
# server disowning ids the routing gives it (a move that stalled or broke), and waiting cannot fix it.
MOVED_PATIENCE = 10.0
RESEND_AFTER = 0.25     # no newer routing yet: how long to wait for one before resending as it was


@dataclasses.dataclass(frozen=True)
class TableSpec:
    name: str
    dim: int
    optimizer: OptimizerConfig
    seed: int = 0
    init_scale: float = 0.01
    admission: Admission = Admission()
    eviction: Eviction = Eviction()
    capacity: int = 0           # rows to make room for up front, over all servers (0: grow as ids come)
    dtype: str = "float32"      # how the servers store rows: float32, float16, bfloat16 (server/storage/row_formats.py)
    rounding: str = "nearest"   # how updated half rows are rounded: nearest, stochastic
    memory_budget: int | None = None    # bytes of RAM for the table on each server (None: every row in RAM)

    def __post_init__(self):
        check_table_settings(self.name, self.dim, self.seed, self.init_scale)
        check_row_format(self.name, self.dtype, self.rounding)
        if not isinstance(self.capacity, int) or self.capacity < 0:
            raise ConfigError(f"table {self.name!r}: capacity must be a whole number of rows >= 0, "
                              f"got {self.capacity!r}")
        object.__setattr__(self, "memory_budget", parse_budget(self.memory_budget,
                                                               f"table {self.name!r}: memory_budget"))


@dataclasses.dataclass
class Partition:
    """Ids grouped by owner server: ids[order[starts[s]:starts[s+1]]] belong to server s."""
    order: np.ndarray | None        # None: one server, ids in their own order
    starts: np.ndarray

    @classmethod
    def of(cls, ids: np.ndarray, routing: "int | Routing") -> "Partition":
        """``routing``: the job's Routing, or a server count (the fixed routing)."""
        if isinstance(routing, int):
            routing = Routing.initial(0, ("",) * routing)
        num_servers = len(routing.addresses)
        if num_servers == 1:
            return cls(None, np.array([0, len(ids)]))
        owners = routing.servers_of(ids)
        order = np.argsort(owners, kind="stable")
        starts = np.zeros(num_servers + 1, np.int64)
        np.cumsum(np.bincount(owners, minlength=num_servers), out=starts[1:])
        return cls(order, starts)

    def part(self, server: int):
        """Index (array, or a slice when nothing needs reordering) of server's ids."""
        if self.order is None:
            return slice(None)
        return self.order[self.starts[server]:self.starts[server + 1]]

    def count(self, server: int) -> int:
        return int(self.starts[server + 1] - self.starts[server])


class SparseClient:
    def __init__(self, links: ServerLinks, trainer_id: int, routing: Routing | None = None):
        """``routing``: the job's (Routing.initial(PARAMSHARD_PARTITIONS, servers)); None: the
        fixed routing over ``links``."""
        self.links, self.trainer_id = links, trainer_id
        self.routing = routing or Routing.initial(0, ("",) * len(links))
        self._last: dict[str, tuple[np.ndarray, Partition, int]] = {}   # table -> the last pull's ids
        self.resent = 0              # requests sent again after a ``moved``
        self.moved_patience = MOVED_PATIENCE
        self._stalled: tuple[int, float] | None = None     # (routing version refused under, give up at)

    @property
    def num_servers(self) -> int:
        return len(self.routing.addresses)

    def _partition(self, table: str, ids: np.ndarray) -> Partition:
        self.catch_up_with_links()
        # A push usually carries the very array its pull had: partition it once.
        last = self._last.get(table)
        if last is not None and last[0] is ids and last[2] == self.routing.version:
            return last[1]
        part = Partition.of(ids, self.routing)
        self._last[table] = (ids, part, self.routing.version)
        return part

    # -- routing (elastic jobs) ------------------------------------------------
    def catch_up_with_links(self) -> None:
        """Another user of these links followed a newer routing than this one and let go of a
        server this one still names (a checkpoint's save reads server 0's routing on the
        trainer's own links: client/checkpoint.py job_routing): this routing is older than that
        one, and the links send nothing to that server. Take server 0's before routing by it."""
        addresses = self.routing.addresses
        if any(address and self.links.is_retired(s) for s, address in enumerate(addresses)):
            self.refresh_routing(newer_than=self.routing.version)

    def refresh_routing(self, newer_than: int = -1, patience: float | None = None) -> Routing:
        """The routing server 0 holds, once it is newer than ``newer_than`` (or when ``patience``
        seconds, at most the links' timeout, have passed: the caller checks the version). Servers
        it names for the first time are connected, those it names retired are let go."""
        wait = self.links.timeout if patience is None else min(patience, self.links.timeout)
        deadline = time.monotonic() + wait
        while True:
            header, _ = self.links.request(0, {"op": "routing_get"})
            routing = Routing.from_wire(header["routing"])
            if routing.version > newer_than or time.monotonic() > deadline:
                break
            time.sleep(0.02)        # a sync switch armed before server 0 publishes: rarely taken
        if routing.partitions != self.routing.partitions and self.routing.partitions:
            raise ProtocolError(f"server 0 routes by {routing.partitions} partitions, this trainer by "
                                f"{self.routing.partitions}: PARAMSHARD_PARTITIONS differs")
        if routing.version >= self.routing.version:
            self.routing = routing
            follow_addresses(self.links, routing.addresses)
        return self.routing

    def newer_than_refused(self, refused: list) -> Routing:
        """The routing to send ``refused`` [(server, header, arrays)] again under: the newest this
        trainer knows if it is newer than every one they were sent under (their ``routing``;
        none: older than any), else server 0's once it has a newer one. While server 0 has none,
        the same routing every RESEND_AFTER s: a refusal need not last (a sync switch armed on
        some servers, then re-armed at a later step when another said "too close", lets those
        steps through again) and nothing of a refused request was applied. A DeadlineExceeded
        naming the refusing server when that goes on for ``moved_patience``."""
        sent = max(sent_under(header) for _, header, _ in refused)
        if self.routing.version > sent:
            self._stalled = None
            return self.routing
        now = time.monotonic()
        if self._stalled is None or self._stalled[0] != sent:
            self._stalled = (sent, now + min(self.moved_patience, self.links.timeout))
        give_up = self._stalled[1]
        self.refresh_routing(newer_than=sent, patience=max(0.0, min(RESEND_AFTER, give_up - now)))
        if self.routing.version > sent:
            self._stalled = None
            return self.routing
        if time.monotonic() < give_up:
            return self.routing
        self._stalled = None
        server, header, _ = next(r for r in refused if sent_under(r[1]) == sent)
        what = header["op"] + (f" of table {header['table']!r}" if "table" in header else "")
        raise DeadlineExceeded(
            f"trainer {self.trainer_id}: server {server} refused its {what} as moved (ids or blocks it does not "
            f"hold) under routing version {sent}, and server 0 still routes by version {self.routing.version} "
            f"after {min(self.moved_patience, self.links.timeout):g} s, naming server {server} their owner: a "
            f"move of partitions stalled or failed half-way (see the launcher's log and the run directory's "
            f"scale_failed event); the job cannot go on with this routing: stop it and start it again")

    def settle(self, replies: list, requests: list) -> list:
        """``replies`` with those refused as ``moved`` (None) replaced: their ids are split
        under a newer routing and sent again (pulls: the rows come back in their order).
        A round goes under a routing newer than the one it was refused under, or under the same
        one while server 0 has no newer (``newer_than_refused``), so this ends with the move or
        fails within ``moved_patience``."""
        if all(r is not None for r in replies):
            return replies
        refused = [slot for slot, reply in enumerate(replies) if reply is None]
        self.newer_than_refused([requests[slot] for slot in refused])
        out = list(replies)
        # A table's refused pushes go again as one push a server (a sync step takes one from each
        # trainer), to every server of the routing that had none, empty or not.
        pushed = {(h["table"], s) for (s, h, _), r in zip(requests, replies) if r is not None and
                  h["op"] == "push_sparse"}
        groups: dict = {}
        for slot in refused:
            _, header, _ = requests[slot]
            key = ("push", header["table"]) if header["op"] == "push_sparse" else ("one", slot)
            groups.setdefault(key, []).append(slot)
        for (kind, name), slots in groups.items():
            header = requests[slots[0]][1]
            arrays = [np.concatenate([requests[slot][2][k] for slot in slots])
                      for k in range(len(requests[slots[0]][2]))]
            part = Partition.of(arrays[0], self.routing)
            again = [(s, {**header, "routing": self.routing.version}, [a[part.part(s)] for a in arrays])
                     for s in range(self.num_servers)
                     if part.count(s) or (kind == "push" and s in self.routing.servers() and (name, s) not in pushed)]
            self.resent += len(again)
            answers = self.settle(self.links.request_list(again), again)
            for slot in slots:
                out[slot] = ({}, [])
            if header["op"] == "pull_sparse" and again:
                rows = np.empty((len(arrays[0]), answers[0][1][0].shape[1]), np.float32)
                for (server, _, _), (_, got) in zip(again, answers):
                    rows[part.part(server)] = got[0]
                out[slots[0]] = ({}, [rows])
        return out

    def register_sparse(self, spec: TableSpec) -> None:
        header = {"op": "register_sparse", "trainer": self.trainer_id, "table": spec.name, "dim": spec.dim, "seed": spec.seed,
                  "optimizer": spec.optimizer.to_wire(),
                  "policy": policy_to_wire(spec.admission, spec.eviction, spec.init_scale),
                  "dtype": spec.dtype, "rounding": spec.rounding}
        if spec.capacity:
            # The hash spreads ids evenly: each server's share, plus a little for the spread.
            header["reserve"] = -(-spec.capacity * 102 // (100 * self.num_servers)) + 1024
        if spec.memory_budget is not None:
            header["memory_budget"] = spec.memory_budget      # each server's share: the table's rows there
        self.links.request_many({s: (header, ()) for s in self.routing.servers()})

    def pull_requests(self, table: str, ids: np.ndarray, min_version: int,
                      create: bool = True) -> tuple[list, Partition]:
        part = self._partition(table, ids)
        requests = []
        for s in range(self.num_servers):
            mine = part.part(s)
            if part.count(s):
                requests.append((s, {"op": "pull_sparse", "table": table, "trainer": self.trainer_id,
                                     "min_version": min_version, "create": create, "epoch": self.links.epoch,
                                     "routing": self.routing.version},
                                 [ids[mine]]))
        return requests, part

    @staticmethod
    def gather_rows(replies: list, requests: list, part: Partition, n: int, dim: int) -> np.ndarray:
        out = np.empty((n, dim), np.float32)
        for (server, _, _), (header, arrays) in zip(requests, replies):
            n_mine = part.count(server)
            if len(arrays) != 1 or arrays[0].shape != (n_mine, dim):
                raise ProtocolError(f"server {server}: pull_sparse reply of shape "
                                    f"{[a.shape for a in arrays]}, expected ({n_mine}, {dim})")
            out[part.part(server)] = arrays[0]
        return out

    def pull_sparse(self, table: str, ids: np.ndarray, dim: int, min_version: int = 0,
                    create: bool = True) -> np.ndarray:
        """Rows of distinct ``ids``; ``create=False`` stores no new rows (evaluation)."""
        requests, part = self.pull_requests(table, ids, min_version, create)
        replies = self.settle(self.links.request_list(requests), requests)
        return self.gather_rows(replies, requests, part, len(ids), dim)

    def push_requests(self, table: str, ids: np.ndarray, grads: np.ndarray, step: int) -> list:
        """One push per server, empty ones included: a sync step needs every trainer's word.
        ``ids`` must be distinct (SparseEmbedding.take_gradients merges them)."""
        part = self._partition(table, ids)
        return [(s, {"op": "push_sparse", "table": table, "step": step, "trainer": self.trainer_id,
                     "distinct": True, "epoch": self.links.epoch, "routing": self.routing.version},
                 [ids[part.part(s)], grads[part.part(s)]]) for s in self.routing.servers()]

    def push_sparse(self, table: str, ids: np.ndarray, grads: np.ndarray, step: int) -> None:
        requests = self.push_requests(table, ids, grads, step)
        self.settle(self.links.request_list(requests), requests)

    def export_sparse(self, table: str, with_meta: bool = False):
        """Every server's rows of ``table`` merged, sorted by id (and the table's
        settings as the servers hold them, with ``with_meta``). An elastic job's rows are taken
        from the server owning their partition under server 0's routing: during a move a new
        owner holds the rows it is taking in, and an old owner those it has not dropped yet."""
        routing = self.refresh_routing() if self.routing.elastic else self.routing
        replies = self.links.request_many({s: ({"op": "export_sparse", "table": table}, ())
                                           for s in routing.servers()})
        owned = {s: (routing.servers_of(replies[s][1][0]) == s) if routing.elastic else slice(None)
                 for s in replies}
        ids = np.concatenate([replies[s][1][0][owned[s]] for s in sorted(replies)])
        values = np.concatenate([replies[s][1][1][owned[s]] for s in sorted(replies)])
        order = np.argsort(ids, kind="stable")
        if not with_meta:
            return ids[order], values[order]
        header = replies[min(replies)][0]
        meta = {"name": table, **{k: header[k] for k in ("dim", "seed", "init_scale", "optimizer")}}
        return ids[order], values[order], meta

    def import_sparse(self, table: str, ids: np.ndarray, values: np.ndarray) -> None:
        part = Partition.of(ids, self.routing)
        requests = [(s, {"op": "import_sparse", "table": table}, [ids[part.part(s)], values[part.part(s)]])
                    for s in self.routing.servers()]
        self.settle(self.links.request_list(requests), requests)


def sent_under(header: dict) -> int:
    """The routing version a request was sent under (-1: none named, older than any)."""
    version = header.get("routing")
    return version if type(version) is int else -1


def follow_addresses(links, addresses) -> None:
    """Make ``links`` match a routing's ``addresses``: connect the servers it names for the first
    time, let go of those it names retired (""), whose indices stay as placeholders."""
    for index in range(len(links), len(addresses)):
        links.add_server(addresses[index])
    for index, address in enumerate(addresses):
        if not address and not links.is_retired(index):
            links.retire(index)
