"""The ``scale_lr`` op as a Service (server/core/api.py): trainer 0 changes the learning rate of this
server's dense blocks and sparse tables (``Trainer.scale_learning_rate``; client side:
client/control.py ``scale_learning_rate``).

The new rate is the registered one x the product of every factor so far (``lr_scale`` of the
DenseStore and of each SparseTable), and it is part of their checkpointed state
(checkpoint_service.py), so a restore or a rollback brings back the rate of its checkpoint.

Exact in sync mode: the chief sends it between two of its steps with ``min_version`` = its step
count, and the change waits until every block and named table completed that many steps. No
step after it can complete before it is applied, since the chief pushes its next step only once
every server answered; so every update up to that step ran at the old rate and every one after
at the new. Async: applied as it arrives. All or nothing: every name and the new rates are
checked before anything changes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from paramshard.errors import ConfigError
from paramshard.optim import check_lr_factor, scaled
from paramshard.server.storage.dense_store import DenseStore
from paramshard.server.core.replies import Deferred, Reply
from paramshard.server.services.sparse_service import SparseService


class LearningRates:
    def __init__(self, dense: DenseStore, sparse: SparseService | None):
        self.dense = dense
        self.sparse = sparse

    def ops(self) -> dict:
        return {"scale_lr": self.handle_scale_lr}

    def hooks(self) -> list:
        return []

    def stats(self) -> None:
        return None

    def on_leave(self, trainer: int) -> None:
        pass

    def reset(self) -> None:
        """The scales are the blocks' and tables' state: DenseHandlers and SparseService drop them."""

    def handle_scale_lr(self, header: dict, arrays: list) -> Reply | Deferred:
        trainer, names = header["trainer"], header["tables"]
        if trainer != 0:
            raise ConfigError(f"trainer {trainer} asked to change the learning rate: only the chief (trainer 0) "
                              f"does (every trainer calls scale_learning_rate; the chief tells the servers)")
        if arrays:
            raise ConfigError(f"scale_lr carries no arrays, got {len(arrays)}")
        factor = check_lr_factor(header["factor"])
        if len(set(names)) != len(names):
            raise ConfigError(f"scale_lr names tables {names} more than once")
        tables = [self._table(name) for name in names]
        dense = header["dense"]
        # Every new rate is checked before any changes (scaled raises for one that underflows).
        if dense and self.dense.optimizer is not None:
            scaled(self.dense.optimizer, self.dense.lr_scale * factor)
        for table in tables:
            scaled(table.optimizer, table.lr_scale * factor)
        version = header.get("min_version")
        if version is None or self._completed(dense, tables, version):
            return self._apply(factor, dense, tables)
        return Deferred(ready=lambda: self._completed(dense, tables, version),
                        make_reply=lambda: self._apply(factor, dense, tables),
                        describe=lambda: f"the learning-rate change waits for step {version} to complete: "
                                         f"trainers {self._late(dense, tables)} have not pushed it",
                        waits_on=lambda: self._late(dense, tables))

    def _table(self, name: str):
        if self.sparse is None:
            raise ConfigError(f"scale_lr names table {name!r}, but this server serves no sparse tables")
        return self.sparse.table(name)

    def _completed(self, dense: bool, tables: list, version: int) -> bool:
        blocks = self.dense.blocks.values() if dense else ()
        return all(b.version >= version for b in blocks) and all(t.version >= version for t in tables)

    def _late(self, dense: bool, tables: list) -> list[int]:
        late = set(self.dense.waiting_for(list(self.dense.blocks))) if dense else set()
        for table in tables:
            late.update(table.waiting_for())
        return sorted(late)

    def _apply(self, factor: float, dense: bool, tables: list) -> Reply:
        if dense:
            self.dense.set_lr_scale(self.dense.lr_scale * factor)
        for table in tables:
            table.set_lr_scale(table.lr_scale * factor)
        return Reply({"dense": self.dense.lr_scale, "tables": {t.name: t.lr_scale for t in tables}})


def attach_learning_rates(server) -> LearningRates:
    service = LearningRates(server.dense, server.service(SparseService))
    server.add_service(service)
    return service


if TYPE_CHECKING:   # `make typecheck` checks the contract: Service (server/core/api.py)
    from paramshard.server.core.api import Service
    _service: type[Service] = LearningRates
