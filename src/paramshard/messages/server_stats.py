"""The ``stats`` reply as a type: what a server reports about itself.

One producer, one parser. ``ParameterServer.snapshot_stats`` assembles a
``ServerStats`` from its own counters and the part each service contributes
(``Service.stats()``: a ``Connections``, ``DenseStats``, ``BarrierStats``,
``SparseStats`` or ``DeltaStats``, or None) and sends ``to_wire()``; everyone who reads a reply
(the launcher's watcher, /metrics, the run directory's records, `paramshard
stats`, the trainer's barrier) calls ``from_wire``, which checks every type and
raises ProtocolError naming the field, so a reader never meets a KeyError
halfway through a record.

The wire form is a flat dict (the format `paramshard stats --json` prints and
``Trainer.server_stats()`` returns) and stays as it was: a part a server does
not have (no sparse service) is absent, and ``from_wire`` takes a missing
optional key as "not there", so an older or smaller server still parses.
``to_wire(from_wire(x)) == x`` for every reply a server sends.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NoReturn

from paramshard.errors import ProtocolError

# The loop's own counters always present (others appear once counted: op_<op>, requests_held, ...).
BASE_COUNTERS = ("requests", "bytes_in", "bytes_out", "errors", "timeouts")


# -- type checks: every one names the field it refuses -------------------------------------------
def _fail(where: str, expected: str, value: Any) -> NoReturn:
    raise ProtocolError(f"stats reply: {where}: expected {expected}, got {type(value).__name__} {value!r:.80}")


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(where, "an int", value)
    return value


def _num(value: Any, where: str) -> int | float:
    """A number kept as sent (an int stays an int: the round trip is exact)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(where, "a number", value)
    return value


def _map(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        _fail(where, "a map", value)
    return value


def _ints(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)):
        _fail(where, "a list of ints", value)
    return tuple(_int(v, f"{where}[{i}]") for i, v in enumerate(value))


def _numbers(value: Any, where: str) -> dict[str, int | float]:
    return {_str(k, f"{where} key"): _num(v, f"{where}[{k!r}]") for k, v in _map(value, where).items()}


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        _fail(where, "a str", value)
    return value


# -- the parts services contribute ---------------------------------------------------------------
class _Part:
    """A service's part also reads as its wire fragment (``part["barriers"]``), as the dict
    a service's ``stats()`` returned before the parts had types."""

    def __getitem__(self, key: str):
        return self.to_wire()[key]

    def to_wire(self) -> dict:
        raise NotImplementedError      # each part's own


@dataclasses.dataclass(frozen=True)
class TrainerStates:
    """Trainer ids by state, as the server's membership sees them."""
    live: tuple[int, ...] = ()
    left: tuple[int, ...] = ()       # left the job (done)
    lost: tuple[int, ...] = ()       # their connection dropped

    def to_wire(self) -> dict:
        return {"live": list(self.live), "left": list(self.left), "lost": list(self.lost)}

    @classmethod
    def from_wire(cls, d: Any) -> "TrainerStates":
        d = _map(d, "trainers")
        return cls(*(_ints(d.get(k, ()), f"trainers.{k}") for k in ("live", "left", "lost")))


@dataclasses.dataclass(frozen=True)
class Connections(_Part):
    """The outbox (server/core/outbox.py): replies clients have not read, requests held behind them."""
    FIELD: ClassVar[str] = "connections"
    KEYS: ClassVar[tuple] = ("connections_tracked", "queued_reply_bytes", "held_requests")
    tracked: int = 0
    queued_reply_bytes: int = 0
    held_requests: int = 0

    def to_wire(self) -> dict:
        return dict(zip(self.KEYS, (self.tracked, self.queued_reply_bytes, self.held_requests)))

    @classmethod
    def from_wire(cls, d: dict) -> "Connections | None":
        if not any(k in d for k in cls.KEYS):
            return None
        return cls(*(_int(d.get(k, 0), k) for k in cls.KEYS))


@dataclasses.dataclass(frozen=True)
class DenseStats(_Part):
    """Dense blocks held; ``staleness`` (async only): pushes by staleness, {staleness: count}."""
    FIELD: ClassVar[str] = "dense"
    blocks: int = 0
    elements: int = 0
    staleness: dict[int, int] | None = None

    def to_wire(self) -> dict:
        out: dict = {"dense_blocks": self.blocks, "dense_elements": self.elements}
        if self.staleness is not None:
            out["staleness"] = {str(k): n for k, n in self.staleness.items()}
        return out

    @classmethod
    def from_wire(cls, d: dict) -> "DenseStats | None":
        if not any(k in d for k in ("dense_blocks", "dense_elements", "staleness")):
            return None
        staleness = d.get("staleness")
        if staleness is not None:
            staleness = {_staleness_key(k): _int(n, f"staleness[{k!r}]") for k, n in _map(staleness, "staleness").items()}
        return cls(_int(d.get("dense_blocks", 0), "dense_blocks"), _int(d.get("dense_elements", 0), "dense_elements"),
                   staleness)


def _staleness_key(k: Any) -> int:
    try:
        return int(_str(k, "staleness key"))
    except ValueError:
        _fail("staleness key", "a decimal int as text", k)


@dataclasses.dataclass(frozen=True)
class BarrierWait:
    count: int                       # the count the server waits in
    missing: tuple[int, ...] = ()    # trainers that have not entered it yet


@dataclasses.dataclass(frozen=True)
class BarrierStats(_Part):
    """Named trainer barriers (server/services/trainer_barrier.py): how many, and which are waiting."""
    FIELD: ClassVar[str] = "barriers"
    names: int = 0
    waiting: dict[str, BarrierWait] = dataclasses.field(default_factory=dict)

    def to_wire(self) -> dict:
        return {"barriers": {"names": self.names, "waiting": {
            n: {"count": w.count, "missing": list(w.missing)} for n, w in self.waiting.items()}}}

    @classmethod
    def from_wire(cls, d: dict) -> "BarrierStats | None":
        if "barriers" not in d:
            return None
        b = _map(d["barriers"], "barriers")
        waiting = {}
        for name, w in _map(b.get("waiting", {}), "barriers.waiting").items():
            where = f"barriers.waiting[{name!r}]"
            w = _map(w, where)
            waiting[_str(name, "barrier name")] = BarrierWait(_int(w.get("count"), f"{where}.count"),
                                                              _ints(w.get("missing", ()), f"{where}.missing"))
        return cls(_int(b.get("names", 0), "barriers.names"), waiting)


@dataclasses.dataclass(frozen=True)
class TierStats:
    """A table's disk tier (server/storage/tiered_row_store.py), present only when it has one.
    ``hits``/``misses``: row accesses whose rows were in RAM / had been spilled; ``spills``,
    ``promotions``: regions of rows dropped from RAM / brought back by an access."""
    KEYS: ClassVar[tuple] = ("budget", "resident_bytes", "hits", "misses", "spills", "promotions")
    budget: int = 0                  # the table's budget in bytes (0: only the server's)
    resident_bytes: int = 0          # the resident estimate: ids, index, regions in RAM
    hits: int = 0
    misses: int = 0
    spills: int = 0
    promotions: int = 0

    @property
    def hit_rate(self) -> float:
        accesses = self.hits + self.misses
        return round(self.hits / accesses, 6) if accesses else 1.0

    def to_wire(self) -> dict:
        return {**{k: getattr(self, k) for k in self.KEYS}, "hit_rate": self.hit_rate}

    @classmethod
    def from_wire(cls, t: Any, where: str) -> "TierStats":
        t = _map(t, where)
        if "hit_rate" in t:
            _num(t["hit_rate"], f"{where}.hit_rate")      # derived: checked, then recomputed
        return cls(**{k: _int(t.get(k, 0), f"{where}.{k}") for k in cls.KEYS})


@dataclasses.dataclass(frozen=True)
class TableStats:
    """One sparse table."""
    rows: int = 0
    bytes: int = 0
    version: int = 0                 # updates applied
    evicted: int = 0
    dim: int | None = None
    rows_updated: int = 0
    phase_seconds: dict[str, int | float] = dataclasses.field(default_factory=dict)
    tier: TierStats | None = None    # a table with a memory budget: its disk tier

    def to_wire(self) -> dict:
        out = {"rows": self.rows, "bytes": self.bytes, "version": self.version, "evicted": self.evicted,
               "dim": self.dim, "rows_updated": self.rows_updated, "phase_seconds": dict(self.phase_seconds)}
        if self.tier is not None:
            out["tier"] = self.tier.to_wire()
        return out

    @classmethod
    def from_wire(cls, t: Any, where: str) -> "TableStats":
        t = _map(t, where)
        dim = t.get("dim")
        tier = t.get("tier")
        return cls(**{k: _int(t.get(k, 0), f"{where}.{k}") for k in ("rows", "bytes", "version", "evicted",
                                                                      "rows_updated")},
                   dim=None if dim is None else _int(dim, f"{where}.dim"),
                   phase_seconds=_numbers(t.get("phase_seconds", {}), f"{where}.phase_seconds"),
                   tier=None if tier is None else TierStats.from_wire(tier, f"{where}.tier"))


@dataclasses.dataclass(frozen=True)
class SparseStats(_Part):
    """Sparse tables held (server/services/sparse_service.py): totals and each table."""
    FIELD: ClassVar[str] = "sparse"
    rows: int = 0
    bytes: int = 0
    tables: dict[str, TableStats] = dataclasses.field(default_factory=dict)
    memory_budget: int | None = None     # the server's (PARAMSHARD_MEMORY_BUDGET), bytes
    rss_bytes: int | None = None         # the process's RSS when the budget was last checked

    def to_wire(self) -> dict:
        out = {"sparse_rows": self.rows, "sparse_bytes": self.bytes,
               "tables": {n: t.to_wire() for n, t in self.tables.items()}}
        if self.memory_budget is not None:
            out["memory_budget"] = self.memory_budget
        if self.rss_bytes is not None:
            out["rss_bytes"] = self.rss_bytes
        return out

    @classmethod
    def from_wire(cls, d: dict) -> "SparseStats | None":
        if not any(k in d for k in ("sparse_rows", "sparse_bytes", "tables")):
            return None
        tables = {_str(n, "table name"): TableStats.from_wire(t, f"tables[{n!r}]")
                  for n, t in _map(d.get("tables", {}), "tables").items()}
        budget, rss = d.get("memory_budget"), d.get("rss_bytes")
        return cls(_int(d.get("sparse_rows", 0), "sparse_rows"), _int(d.get("sparse_bytes", 0), "sparse_bytes"), tables,
                   None if budget is None else _int(budget, "memory_budget"),
                   None if rss is None else _int(rss, "rss_bytes"))


def _opt_num(value: Any, where: str) -> int | float | None:
    return None if value is None else _num(value, where)


@dataclasses.dataclass(frozen=True)
class DeltaStats(_Part):
    """What the delta publisher wrote (server/services/delta_service.py), present only on a server
    with PARAMSHARD_DELTA_DIR. Counters since the process started: files (``deltas``, ``snapshots``)
    and their bytes, the rows and tombstones the deltas carried; the largest delta, the last
    snapshot; ``last_seq`` (None: nothing published yet), ``since_last_s`` (seconds since the last
    file was published), ``last_publish_s`` (the last file's seconds from taking it to durable)."""
    FIELD: ClassVar[str] = "deltas"
    COUNTS: ClassVar[tuple] = ("deltas", "snapshots", "bytes", "delta_bytes", "snapshot_bytes", "rows", "tombstones",
                               "max_delta_bytes", "max_delta_rows", "last_snapshot_bytes", "last_snapshot_rows")
    deltas: int = 0
    snapshots: int = 0
    bytes: int = 0
    delta_bytes: int = 0
    snapshot_bytes: int = 0
    rows: int = 0                    # rows the deltas carried (snapshots not counted)
    tombstones: int = 0
    max_delta_bytes: int = 0
    max_delta_rows: int = 0
    last_snapshot_bytes: int = 0
    last_snapshot_rows: int = 0
    last_seq: int | None = None
    since_last_s: int | float | None = None
    last_publish_s: int | float | None = None

    def to_wire(self) -> dict:
        return {"deltas": {**{k: getattr(self, k) for k in self.COUNTS}, "last_seq": self.last_seq,
                           "since_last_s": self.since_last_s, "last_publish_s": self.last_publish_s}}

    @classmethod
    def from_wire(cls, d: dict) -> "DeltaStats | None":
        if "deltas" not in d:
            return None
        p = _map(d["deltas"], "deltas")
        last_seq = p.get("last_seq")
        return cls(**{k: _int(p.get(k, 0), f"deltas.{k}") for k in cls.COUNTS},
                   last_seq=None if last_seq is None else _int(last_seq, "deltas.last_seq"),
                   since_last_s=_opt_num(p.get("since_last_s"), "deltas.since_last_s"),
                   last_publish_s=_opt_num(p.get("last_publish_s"), "deltas.last_publish_s"))


StatsPart = Connections | DenseStats | BarrierStats | SparseStats | DeltaStats
# In wire order: the outbox first, then the services as a server adds them (server/core/parameter_server.py).
PARTS = (Connections, DenseStats, BarrierStats, SparseStats, DeltaStats)
_OWN_KEYS = {"server", "address", "uptime_s", "started_at", "trainers", "phase_seconds", *Connections.KEYS,
             "dense_blocks", "dense_elements", "staleness", "barriers", "sparse_rows", "sparse_bytes", "tables",
             "memory_budget", "rss_bytes", "deltas"}


# -- the whole reply ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ServerStats:
    server: int
    address: str | None = None
    uptime_s: int | float = 0.0
    # The process's start (Unix time): which process answered. Two readers' uptimes of one process
    # disagree by their reading delays, and a new process may be older at its first record than
    # the old one was at its last; the start says "another process" exactly (0: not sent).
    started_at: int | float = 0.0
    trainers: TrainerStates = TrainerStates()
    phase_seconds: dict[str, int | float] = dataclasses.field(default_factory=dict)   # op or wire phase -> s
    # The loop's counters, in the order they were first counted: BASE_COUNTERS, op_<op>,
    # requests_held/refused, held_dropped, deferred_answered, deferred_wait_s (s), replies_dropped.
    counters: dict[str, int | float] = dataclasses.field(default_factory=dict)
    connections: Connections | None = None
    dense: DenseStats | None = None
    barriers: BarrierStats | None = None
    sparse: SparseStats | None = None
    deltas: DeltaStats | None = None

    @classmethod
    def assemble(cls, parts, **fields) -> "ServerStats":
        """The server's own ``fields`` and each service's part (None: it adds nothing)."""
        by_field: dict[str, Any] = {}        # each part as its own field (the checker cannot pair them)
        for part in parts:
            if part is None:
                continue
            if not isinstance(part, PARTS):
                raise TypeError(f"a service's stats() gave {type(part).__name__}: expected one of "
                                f"{', '.join(p.__name__ for p in PARTS)} or None")
            if part.FIELD in by_field:
                raise ValueError(f"two services report {part.FIELD} stats")
            by_field[part.FIELD] = part
        return cls(**fields, **by_field)

    # -- figures every reader wants, whatever the server has ---------------------------------------
    def counter(self, name: str) -> int | float:
        return self.counters.get(name, 0)

    @property
    def requests(self) -> int | float:      # a counter: numbers on the wire
        return self.counter("requests")

    @property
    def ops(self) -> dict[str, int | float]:
        """Requests received, by op."""
        return {k[3:]: n for k, n in self.counters.items() if k.startswith("op_")}

    @property
    def dense_blocks(self) -> int:
        return self.dense.blocks if self.dense else 0

    @property
    def dense_elements(self) -> int:
        return self.dense.elements if self.dense else 0

    @property
    def staleness(self) -> dict[int, int]:
        """Async pushes by staleness; empty when not counted (sync mode)."""
        return dict(self.dense.staleness or {}) if self.dense else {}

    @property
    def sparse_rows(self) -> int:
        return self.sparse.rows if self.sparse else 0

    @property
    def sparse_bytes(self) -> int:
        return self.sparse.bytes if self.sparse else 0

    @property
    def tables(self) -> dict[str, TableStats]:
        return dict(self.sparse.tables) if self.sparse else {}

    # -- the wire ------------------------------------------------------------------------------------
    def to_wire(self) -> dict:
        out: dict = {"server": self.server}
        if self.address is not None:
            out["address"] = self.address
        out["uptime_s"] = self.uptime_s
        if self.started_at:
            out["started_at"] = self.started_at
        out.update({"trainers": self.trainers.to_wire(), "phase_seconds": dict(self.phase_seconds)})
        out.update(self.counters)
        for part in (self.connections, self.dense, self.barriers, self.sparse, self.deltas):
            if part is not None:
                out.update(part.to_wire())
        return out

    @classmethod
    def from_wire(cls, d: Any) -> "ServerStats":
        """Parse a ``stats`` reply; ProtocolError naming the first field of the wrong type. Only
        ``server`` is required; a key this version does not know is kept if it is a counter
        (a number) and dropped otherwise."""
        d = _map(d, "the reply")
        if "server" not in d:
            raise ProtocolError("stats reply: no 'server' field")
        address = d.get("address")
        counters = {k: v for k, v in d.items() if k not in _OWN_KEYS and isinstance(k, str)
                    and isinstance(v, (int, float)) and not isinstance(v, bool)}
        for k in BASE_COUNTERS:
            if k in d:
                _num(d[k], k)      # a known counter of the wrong type is an error, not an unknown key
        # Checked in this order: the first field of the wrong type is the one named.
        server = _int(d["server"], "server")
        address = None if address is None else _str(address, "address")
        uptime_s = _num(d.get("uptime_s", 0.0), "uptime_s")
        started_at = _num(d.get("started_at", 0.0), "started_at")
        trainers = TrainerStates.from_wire(d.get("trainers", {}))
        phase_seconds = _numbers(d.get("phase_seconds", {}), "phase_seconds")
        parts: dict[str, Any] = {p.FIELD: p.from_wire(d) for p in PARTS}    # as in assemble
        return cls(server=server, address=address, uptime_s=uptime_s, started_at=started_at, trainers=trainers,
                   phase_seconds=phase_seconds, counters=counters, **parts)
