"""Train an nn.Module through the parameter servers.

The chief (trainer 0) registers the model's dense parameters, the optimizer
and every SparseEmbedding table with the servers; every trainer then pulls
the dense values, so all start from the same point. ``step(loss)`` runs
backward, pushes dense gradients and sparse row gradients together, and
receives the updated dense parameters in the same round trip.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import runtime
from ..client.dense import DenseClient
from ..client.sparse import SparseClient
from ..env import ClusterEnv
from ..errors import ConfigError
from ..log import get_logger
from ..optim import SGD, OptimizerConfig
from ..sharding import ParamSpec, make_plan
from ..transport.client import ServerLinks
from .sparse_embedding import SparseEmbedding

log = get_logger("trainer")


class Trainer:
    def __init__(self, model: torch.nn.Module, optimizer: OptimizerConfig | None = None,
                 env: ClusterEnv | None = None):
        self.env = env or runtime.current()
        if self.env.role != "trainer":
            raise ConfigError(f"Trainer needs a trainer process, this one is {self.env.rank_name}")
        self.model = model
        self.optimizer = optimizer or SGD(lr=0.01)
        self.trainer_id = self.env.trainer_id
        self.is_chief = self.trainer_id == 0
        self.step_count = 0
        self._params = self._dense_parameters(model)
        self.plan = make_plan([ParamSpec(n, tuple(p.shape)) for n, p in self._params],
                              len(self.env.servers), self.env.dispatch, self.env.min_block_size)
        self.links = ServerLinks(self.env.servers, self.env.timeout, who=self.env.rank_name,
                                 secret=self.env.secret)
        self.dense = DenseClient(self.links, self.plan, self.trainer_id)
        self.sparse = SparseClient(self.links, self.trainer_id)
        self.tables = self._sparse_tables(model)
        # Flat numpy views sharing memory with the parameters: pulls land in place.
        self._values = {n: p.detach().view(-1).numpy() for n, p in self._params}
        self._closed = False
        if self.is_chief:
            self.dense.register_dense(self._values, self.optimizer)
            for table in self.tables.values():
                self.sparse.register_sparse(table.spec)
            log.info("registered %d parameters (%d blocks) and %d sparse tables with %d servers, "
                     "dense load ratio %.3f", len(self._params), len(self.plan.blocks), len(self.tables),
                     self.plan.num_servers, self.plan.load_ratio())
        self.dense.pull_dense(self._values, min_version=0)
        for table in self.tables.values():
            table._puller = self._pull_rows

    @staticmethod
    def _sparse_tables(model: torch.nn.Module) -> dict[str, SparseEmbedding]:
        tables: dict[str, SparseEmbedding] = {}
        for module in model.modules():
            if isinstance(module, SparseEmbedding):
                if module.name in tables and tables[module.name] is not module:
                    raise ConfigError(f"two SparseEmbedding modules are named {module.name!r}; "
                                      f"share one module to share a table")
                tables[module.name] = module
        return tables

    def _pull_rows(self, table: SparseEmbedding, ids: np.ndarray, create: bool = True) -> np.ndarray:
        # Sync: rows must include every update of the steps before this one.
        version = self.step_count if self.env.mode == "sync" else 0
        return self.sparse.pull_sparse(table.name, ids, table.dim, version, create)

    @staticmethod
    def _dense_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
        params = []
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            if p.dtype != torch.float32 or p.device.type != "cpu" or not p.is_contiguous():
                raise ConfigError(f"parameter {name}: paramshard serves contiguous float32 CPU "
                                  f"tensors, this one is {p.dtype} on {p.device}")
            params.append((name, p))
        return params

    def step(self, loss: torch.Tensor | None = None) -> None:
        """Backward (if ``loss`` is given), push gradients, take the new values."""
        if self._closed:
            raise ConfigError("Trainer.step after close()")
        if loss is not None:
            loss.backward()
        grads = {}
        for name, p in self._params:
            # A parameter the loss did not touch still takes part in the step
            # (sync servers wait for every trainer): its gradient is zero.
            grads[name] = (p.grad.detach().contiguous().view(-1).numpy() if p.grad is not None
                           else np.zeros(p.numel(), np.float32))
        dense_requests = self.dense.push_requests(grads, self.step_count, want_values=True)
        requests = list(dense_requests)
        for table in self.tables.values():
            ids, row_grads = table.take_gradients()
            requests += self.sparse.push_requests(table.name, ids, row_grads, self.step_count)
        replies = self.links.request_list(requests)
        self.dense.scatter(dense_requests, replies[:len(dense_requests)], self._values)
        self.step_count += 1
        for _, p in self._params:
            p.grad = None

    def pull(self) -> None:
        """Fetch the current parameter values (e.g. before evaluating in async mode)."""
        version = self.step_count if self.env.mode == "sync" else 0
        self.dense.pull_dense(self._values, min_version=version)

    def export_table(self, name: str, path) -> int:
        """Write every server's rows of table ``name`` into one file (see paramshard.export)."""
        from ..export import save_table
        self._table(name)
        ids, values, meta = self.sparse.export_sparse(name, with_meta=True)
        save_table(path, meta, ids, values)
        return len(ids)

    def import_table(self, name: str, path) -> int:
        """Load rows exported by an earlier job into table ``name`` (chief only, before training)."""
        from ..export import load_table
        table = self._table(name)
        exported = load_table(path)
        if exported.dim != table.dim:
            raise ConfigError(f"{path}: rows of dim {exported.dim}, table {name!r} has dim {table.dim}")
        self.sparse.import_sparse(name, exported.ids, exported.values)
        return len(exported.ids)

    def _table(self, name: str) -> SparseEmbedding:
        if name not in self.tables:
            raise ConfigError(f"no SparseEmbedding named {name!r} in this model; tables: {sorted(self.tables)}")
        return self.tables[name]

    def server_stats(self) -> list[dict]:
        replies = self.links.request_many({s: ({"op": "stats"}, ()) for s in range(len(self.links))})
        return [replies[s][0]["stats"] for s in sorted(replies)]

    def close(self) -> None:
        """Tell every server this trainer is done (sync barriers stop waiting for it)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.links.request_many({s: ({"op": "leave", "trainer": self.trainer_id}, ())
                                     for s in range(len(self.links))}, timeout=10)
        finally:
            self.links.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
