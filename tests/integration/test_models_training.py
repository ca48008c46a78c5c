"""paramshard.models trained with the real SparseEmbedding against the server ``ps.init()``
makes inside this process when there is no cluster: the loss goes down, the default factory
makes the tables "wide" and "deep" with the given settings, and every prefetch is used."""
import logging
import os
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as Fn

import paramshard as ps
from paramshard import log as ps_log
from paramshard.models import MODELS, build_model
from paramshard.trainer.sparse_embedding import tables_of

F, EPOCHS = 4, 4


@pytest.fixture
def local_server(monkeypatch):
    """``ps.init()`` as in a script run with no cluster: no launcher variable may leak in,
    and the process-wide log settings it sets are put back afterwards."""
    for key in list(os.environ):
        if key.startswith(("PARAMSHARD_", "PADDLE_", "OMPI_")) or key == "TRAINING_ROLE":
            monkeypatch.delenv(key)
    logger = logging.getLogger("paramshard")
    saved = (list(logger.handlers), logger.propagate, logger.level, ps_log._configured)
    env = ps.init()
    assert env.role == "trainer" and env.local_server is not None
    yield env
    env.local_server.close()
    logger.handlers[:], logger.propagate, ps_log._configured = saved[0], saved[1], saved[3]
    logger.setLevel(saved[2])


def separable(num_dense, batches=6, batch=32):
    """Label = sign of a hidden weight per feature value + a dense direction."""
    rng = np.random.default_rng(3)
    secret = rng.standard_normal((F, 10))
    data = []
    for _ in range(batches):
        values = rng.integers(0, 10, (batch, F))
        dense = rng.standard_normal((batch, num_dense)).astype(np.float32)
        score = secret[np.arange(F), values].sum(1) + dense.sum(1)
        ids = (values + 1000 * np.arange(F)) * -0x61C8864680B583EB        # field-distinct, some negative
        data.append((torch.from_numpy(dense), torch.from_numpy(ids.astype(np.int64)),
                     torch.from_numpy((score > 0).astype(np.float32))))
    return data


@pytest.mark.parametrize("name", list(MODELS))
def test_trains_with_sparse_embedding_in_process(local_server, name):
    kw = {} if name == "lr" else {"dim": 4, "hidden": (16,)}
    model = build_model(name, types.SimpleNamespace(num_dense=2, num_fields=F, sequences=[(1, 0)]), capacity=64,
                        table_optimizer=ps.optim.Adagrad(lr=0.2), prefix="ctr_", **kw)
    tables = tables_of(model)
    assert set(tables) == ({"ctr_wide"} if name == "lr" else {"ctr_wide", "ctr_deep"})
    assert all(t.spec.optimizer == ps.optim.Adagrad(lr=0.2) and t.spec.capacity == 64 for t in tables.values())
    data = separable(2)
    losses = []
    with ps.Trainer(model, optimizer=ps.optim.Adam(lr=1e-3)) as trainer:
        for _ in range(EPOCHS):
            for dense, ids, y in trainer.prefetching(data):
                loss = Fn.binary_cross_entropy_with_logits(model(dense, ids), y)
                trainer.step(loss)
                losses.append(loss.item())
        hits = trainer.pipeline_stats()["prefetch_hits"]
    first, last = np.mean(losses[:len(data)]), np.mean(losses[-len(data):])
    assert last < 0.8 * first, losses
    # One lookup per table per forward, on the batch's own ids: every prefetch is used (sync: all
    # but each epoch's first two batches, as in tests/integration/test_in_process.py).
    assert hits == len(tables) * EPOCHS * (len(data) - 2)
