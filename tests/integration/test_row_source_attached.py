"""A Trainer attaches its backend's RowSource (trainer/backends/row_source.py) to every
SparseEmbedding: the forward reads through the backend at the trainer's step, not through the
Trainer (unit tests of the seam: tests/unit/trainer/backends/test_row_source.py)."""
import torch

import paramshard as ps
from paramshard.env import ClusterEnv
from paramshard.server.assembly import build_server
from paramshard.trainer.sparse_embedding import SparseEmbedding
from paramshard.trainer.trainer import Trainer


def test_the_trainer_attaches_its_backends_row_source_to_every_table():
    server = build_server(ClusterEnv(role=None, server_id=0), num_trainers=1, watch_peers=False, in_process=True)
    env = ClusterEnv(role="trainer", servers=(server.address,), local_server=server, num_trainers=1, trainer_id=0,
                     timeout=10.0)
    model = torch.nn.Sequential(SparseEmbedding("a", 2), SparseEmbedding("b", 3))
    try:
        with Trainer(model, ps.optim.SGD(lr=0.1), env=env) as trainer:
            asked = []
            real = trainer.backend.rows
            trainer.backend.rows = lambda table, ids, dim, step, create: asked.append((table, dim, step)) or \
                real(table, ids, dim, step, create)
            ids = torch.tensor([[1], [2]])
            model[0](ids).sum().backward()
            trainer.step()
            model[1](ids)
            assert asked == [("a", 2, 0), ("b", 3, 1)]
    finally:
        server.close()
