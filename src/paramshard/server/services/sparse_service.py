"""Server side of the sparse-table requests (client side: paramshard.client.sparse)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError
from paramshard.limits import Limits
from paramshard.mode import Mode
from paramshard.optim import from_wire
from paramshard.tables import check_row_format, policy_from_wire
from paramshard.messages.server_stats import SparseStats, TableStats, TierStats
from paramshard.server.core.barrier import Membership
from paramshard.server.core.replies import Deferred, Reply
from paramshard.server.storage.row_store import RowStore
from paramshard.server.storage.row_stores import configured_store, store_named, takes_budgets
from paramshard.server.storage.sparse_table import SparseTable
from paramshard.server.storage.tier_dirs import TierRoot


class SparseService:
    """The sparse-table Service (server/core/api.py)."""

    def __init__(self, mode: str | Mode, membership: Membership, limits: Limits = Limits(),
                 store: Callable[..., RowStore] | None = None, memory_budget: int | None = None,
                 tiers: TierRoot | None = None):
        """``store``: what holds the tables' rows (row_stores.py; default: PARAMSHARD_ROW_STORE).
        ``memory_budget``: the server's (PARAMSHARD_MEMORY_BUDGET), bytes of RSS: every table is
        tiered and the coldest rows of all of them spill past it. ``tiers``: where tiered tables
        keep their files (tier_dirs.py; default: a private temporary directory)."""
        self.mode = Mode.parse(mode)
        self.membership = membership
        self.limits = limits
        self.store = store or configured_store()
        self.tables: dict[str, SparseTable] = {}
        self.tiers = tiers or TierRoot(None, 0)
        # (table, ids) of a sync push applied after its request was answered as deferred: the
        # migration service marks them changed when a move is copying (migration_service.py)
        self.on_late_push: Callable[[str, np.ndarray], None] | None = None
        self.server_budget = None
        if memory_budget is not None:
            if not takes_budgets(self.store):
                raise ConfigError(f"PARAMSHARD_MEMORY_BUDGET: this server's row store keeps every row in RAM; a "
                                  f"memory budget needs the compiled row store (unset PARAMSHARD_ROW_STORE)")
            from paramshard.server.storage.tiered_row_store import ServerBudget
            self.server_budget = ServerBudget(memory_budget)

    def ops(self) -> dict:
        return {op: getattr(self, f"handle_{op}") for op in
                ("register_sparse", "pull_sparse", "push_sparse", "export_sparse", "import_sparse")}

    def table(self, name: str) -> SparseTable:
        table = self.tables.get(name)
        if table is None:
            raise ConfigError(f"unknown sparse table {name!r}; registered: {sorted(self.tables) or 'none'}")
        return table

    def _ids(self, arrays: list, n_arrays: int, op: str) -> np.ndarray:
        if len(arrays) != n_arrays:
            raise ConfigError(f"{op} carries {len(arrays)} arrays, expected {n_arrays}")
        ids = arrays[0]
        if ids.dtype != np.uint64 or ids.ndim != 1:
            raise ConfigError(f"{op}: ids must be a flat uint64 array, got {ids.dtype}{list(ids.shape)}")
        self.limits.check("max_ids", len(ids), f"{op}: ids in one request")
        return ids

    def handle_register_sparse(self, header: dict, arrays: list) -> Reply:
        """Only the chief creates a table; anyone may repeat the identical registration."""
        name, trainer = header["table"], header["trainer"]
        self.limits.check("max_dim", header["dim"], f"table {name!r}: dim")
        admission, eviction, init_scale = policy_from_wire(header["policy"])
        config = (header["dim"], header["seed"], from_wire(header["optimizer"]), admission, eviction, init_scale)
        # How rows are stored (row_formats.py); absent: float32, as before half rows existed.
        row_format = {"dtype": header.get("dtype", "float32"), "rounding": header.get("rounding", "nearest")}
        check_row_format(name, row_format["dtype"], row_format["rounding"])
        existing = self.tables.get(name)
        if existing is not None:
            same = (existing.dim, existing.seed, existing.optimizer, existing.admission,
                    existing.eviction, existing.init_scale) == config
            if not same:
                raise ConfigError(f"table {name!r} is already registered with other settings; every trainer "
                                  f"must declare the same tables")
            held = {"dtype": existing.dtype, "rounding": existing.rounding}
            if held != row_format:
                raise ConfigError(f"table {name!r} is already registered with other settings: its rows are "
                                  f"{held['dtype']} ({held['rounding']} rounding), this registration asks for "
                                  f"{row_format['dtype']} ({row_format['rounding']}); every trainer must declare "
                                  f"the same tables")
            return Reply({"rows": existing.num_rows})
        if trainer != 0:
            raise ConfigError(f"trainer {trainer} tried to create table {name!r}: only the chief (trainer 0) "
                              f"registers tables")
        reserve = header.get("reserve") or 0
        if reserve < 0:
            raise ConfigError(f"table {name!r}: reserve must be >= 0 rows, got {reserve}")
        self.limits.check("max_rows", reserve, f"table {name!r}: rows reserved on this server")
        budget = header.get("memory_budget")
        tier_dir = None
        if budget is not None or self.server_budget is not None:
            if not takes_budgets(self.store):
                raise ConfigError(f"table {name!r}: memory_budget needs the compiled row store; this server "
                                  f"keeps every row in RAM (PARAMSHARD_ROW_STORE=numpy)")
            tier_dir = self.tiers.table_dir(name)
        table = SparseTable(name, *config, mode=self.mode, membership=self.membership, limits=self.limits,
                            store=self.store, dtype=row_format["dtype"], rounding=row_format["rounding"],
                            memory_budget=budget, tier_dir=tier_dir, server_budget=self.server_budget)
        try:
            table.reserve(reserve)     # before the table is served: a MemoryError leaves no half table
        except BaseException:
            table.close()
            raise
        self.tables[name] = table
        return Reply({"rows": 0})

    def handle_pull_sparse(self, header: dict, arrays: list) -> Reply | Deferred:
        name, version = header["table"], header["min_version"]
        ids = self._ids(arrays, 1, "pull_sparse").copy()   # the frame is released after this call

        def ready():
            table = self.tables.get(name)
            return table is not None and (not self.mode.waits_every_step or table.version >= version)

        def describe():
            if name not in self.tables:
                return f"the chief (trainer 0) has not registered sparse table {name!r}"
            late = self.tables[name].waiting_for()
            return f"table {name!r} step {version} is not complete: trainers {late} have not pushed"

        def waits_on():
            return self.tables[name].waiting_for() if name in self.tables else [0]

        trainer, create = header["trainer"], header.get("create", True)
        return Deferred(ready=ready, make_reply=lambda: Reply({}, [self.table(name).pull(ids, trainer, create)]),
                        describe=describe, waits_on=waits_on)

    def handle_push_sparse(self, header: dict, arrays: list) -> Reply | Deferred:
        name, trainer, step = header["table"], header["trainer"], header["step"]
        table = self.table(name)
        ids = self._ids(arrays, 2, "push_sparse")
        grads = arrays[1]
        if grads.dtype != np.float32:
            raise ConfigError(f"push_sparse: gradients must be float32, got {grads.dtype}")
        distinct = header.get("distinct") is True
        if self.mode.waits_every_step and type(step) is int and step == table.version + 1:
            return self._early_push(name, trainer, step, ids.copy(), grads.copy(), distinct)
        table.push(trainer, step, ids, grads, distinct=distinct)
        return Reply()

    def _early_push(self, name: str, trainer: int, step: int, ids: np.ndarray, grads: np.ndarray,
                    distinct: bool) -> Deferred:
        """Sync: a push of the step after the one in progress. This trainer finished that step
        elsewhere (its dense reply came from servers where every trainer had pushed it) while
        another trainer's push of it to this server is still on its way: nothing orders two
        trainers' messages to one server, and a server holding no dense block has no reply that
        would. It waits here for the step in progress to complete, then counts as arrived."""
        def ready():
            table = self.tables.get(name)
            return table is not None and table.version >= step

        def apply() -> Reply:
            self.table(name).push(trainer, step, ids, grads, distinct=distinct)
            if self.on_late_push is not None:
                self.on_late_push(name, ids)      # a move copying now must see these rows change
            return Reply()

        def describe():
            late = self.tables[name].waiting_for() if name in self.tables else []
            return (f"trainer {trainer}'s push of step {step} for table {name!r} waits for step {step - 1}: "
                    f"trainers {late} have not pushed it here")

        return Deferred(ready=ready, make_reply=apply, describe=describe,
                        waits_on=lambda: self.tables[name].waiting_for() if name in self.tables else [])

    def handle_export_sparse(self, header: dict, arrays: list) -> Reply:
        table = self.table(header["table"])
        ids, values = table.export()
        return Reply({"dim": table.dim, "seed": table.seed, "init_scale": table.init_scale,
                      "optimizer": table.optimizer.to_wire()}, [ids, values])

    def handle_import_sparse(self, header: dict, arrays: list) -> Reply:
        table = self.table(header["table"])
        ids = self._ids(arrays, 2, "import_sparse")
        table.load(ids, np.asarray(arrays[1], np.float32))
        return Reply({"rows": table.num_rows})

    def reset(self) -> None:
        for table in self.tables.values():
            table.close()          # a tier's files now, not when the tables are collected
        self.tables = {}

    def on_leave(self, trainer: int) -> None:
        if self.mode.waits_every_step:      # sync: a step may have waited only for this trainer
            for table in self.tables.values():
                table.maybe_finish_step()

    def steps_done(self) -> int:
        """Sync: the tables' highest completed step (async: 0, the dense clocks count steps)."""
        if not self.mode.waits_every_step:
            return 0
        return max((t.version for t in self.tables.values()), default=0)

    def hooks(self) -> list:
        return []

    def stats(self) -> SparseStats:
        return SparseStats(
            rows=sum(t.num_rows for t in self.tables.values()), bytes=sum(t.nbytes for t in self.tables.values()),
            tables={n: TableStats(rows=t.num_rows, bytes=t.nbytes, version=t.version, evicted=t.evicted, dim=t.dim,
                                  rows_updated=t.rows_updated,
                                  phase_seconds={k: round(v, 6) for k, v in t.timings.items()},
                                  tier=_tier_stats(t))
                    for n, t in self.tables.items()},
            memory_budget=None if self.server_budget is None else self.server_budget.budget,
            rss_bytes=None if self.server_budget is None else self.server_budget.last_rss)


def _tier_stats(table: SparseTable) -> TierStats | None:
    figures = table.tier_stats()
    return None if figures is None else TierStats(**figures)


def attach_sparse(server, env: ClusterEnv) -> SparseService:
    """The sparse service of a server; PARAMSHARD_MEMORY_BUDGET (``env.memory_budget``) gives it a
    server budget."""
    budget = env.memory_budget
    service = SparseService(server.context.mode, server.context.membership, env.limits,
                            store=store_named(env.row_store), memory_budget=budget, tiers=TierRoot.for_server(env))
    server.add_service(service)
    return service


if TYPE_CHECKING:   # `make typecheck` checks the contract: Service (server/core/api.py)
    from paramshard.server.core.api import Service
    _service: type[Service] = SparseService
