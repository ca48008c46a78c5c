"""Trainer 0 decides, every trainer follows (trainer/decisions.py): ``Trainer.broadcast`` and
``Trainer.scale_learning_rate`` through real servers, trainers as threads of this process.

Oracles: every trainer gets the chief's value of each broadcast (sync, and async with pushes in
flight); a sync job that quarters its learning rates at step k trains exactly what one
process with the combined batch trains when its torch optimizers' rates change at step k (and
not what it trains without the change); a checkpoint keeps the rate it was taken with.
"""
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import paramshard as ps
from paramshard.env import ClusterEnv
from paramshard.server.assembly import build_server
from paramshard.errors import ConfigError
from paramshard.placement.sparse_hash import initial_rows
from paramshard.server.services.sparse_service import SparseService
from paramshard.trainer.trainer import Trainer
from tests.conftest import run_in_threads

VOCAB, DIM, SEED, SCALE = 200, 4, 7, 0.1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_every_trainer_gets_the_chiefs_value_of_each_broadcast(cluster, mode):
    c = cluster(servers=2, trainers=3, mode=mode, timeout=10.0, min_block_size=2)
    epochs, got = 4, {}

    def train(t):
        model = nn.Linear(3, 1)
        trainer = Trainer(model, ps.optim.SGD(lr=0.01), env=c.trainer_env(t),
                          max_in_flight=2 if mode == "async" else None)
        for epoch in range(epochs):
            # Async: uneven epochs, the broadcast waits for the slowest (sync steps wait for everyone).
            for _ in range(3 + (t if mode == "async" else 0)):
                trainer.step(model(torch.ones(2, 3)).sum())
            mine = {"epoch": epoch, "stop": epoch == epochs - 1, "auc": 0.5 + epoch / 10} if t == 0 else "ignored"
            got[t, epoch] = trainer.broadcast(mine, name="decide")
            trainer.barrier("decide-after")     # plain barriers go on beside broadcasts
        assert trainer.barrier_counts() == {"decide": epochs, "decide-after": epochs}
        trainer.close()

    run_in_threads([lambda t=t: train(t) for t in range(3)], timeout=60)
    for epoch in range(epochs):
        want = {"epoch": epoch, "stop": epoch == epochs - 1, "auc": 0.5 + epoch / 10}
        assert [got[t, epoch] for t in range(3)] == [want] * 3


class PsModel(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(DIM, 1)
        self.emb = ps.SparseEmbedding("feat", DIM, mode="sum", optimizer=ps.optim.Adagrad(lr=0.2), seed=SEED,
                                      init_scale=SCALE)

    def forward(self, ids):
        return self.head(self.emb(ids)).squeeze(1)


class RefModel(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(DIM, 1)
        self.emb = nn.EmbeddingBag(VOCAB, DIM, mode="sum", sparse=True)
        with torch.no_grad():   # the servers' deterministic initial rows, id by id
            self.emb.weight.copy_(torch.from_numpy(initial_rows(SEED, np.arange(VOCAB, dtype=np.uint64), DIM, SCALE)))

    def forward(self, ids):
        return self.head(self.emb(ids)).squeeze(1)


def make_data(n=160, bag=4):
    rng = np.random.default_rng(3)
    ids = rng.zipf(1.3, (n, bag)) % VOCAB
    y = (rng.random(n) < 0.3).astype(np.float32)
    return torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(y)


def one_process(ids, y, batch, steps, change_at, factor):
    """Both trainers' batches as one, torch's own optimizers; their rates times ``factor`` from ``change_at``."""
    ref = RefModel()
    emb_opt, head_opt = torch.optim.Adagrad(ref.emb.parameters(), lr=0.2), torch.optim.SGD(ref.head.parameters(), lr=0.1)
    for k in range(steps):
        if k == change_at:
            for opt in (emb_opt, head_opt):
                for group in opt.param_groups:
                    group["lr"] *= factor
        xb, yb = ids[k * 2 * batch:(k + 1) * 2 * batch], y[k * 2 * batch:(k + 1) * 2 * batch]
        emb_opt.zero_grad(), head_opt.zero_grad()
        F.binary_cross_entropy_with_logits(ref(xb), yb).backward()
        emb_opt.step(), head_opt.step()
    return ref


def test_a_sync_rate_change_at_step_k_equals_one_process_changing_its_optimizers_rates_at_k(cluster):
    c = cluster(servers=2, trainers=2, mode="sync", min_block_size=2)
    ids, y = make_data()
    batch, steps, change_at, factor = 8, 8, 3, 0.25
    dataset = torch.utils.data.TensorDataset(ids, y)
    models = [PsModel() for _ in range(2)]       # here, not in the threads: they seed torch's global RNG

    def train(t):
        model = models[t]
        trainer = Trainer(model, ps.optim.SGD(lr=0.1), env=c.trainer_env(t))
        loader = torch.utils.data.DataLoader(ps.shard(dataset, batch_size=batch, trainer_id=t, num_trainers=2),
                                             batch_size=batch)
        for k, (xb, yb) in enumerate(trainer.prefetching(loader)):
            if k == steps:
                break
            if k == change_at:      # the chief decides, every trainer follows at the same step
                decision = trainer.broadcast({"decay": factor} if t == 0 else None, name="plateau")
                trainer.scale_learning_rate(decision["decay"])
            trainer.step(F.binary_cross_entropy_with_logits(model(xb), yb))
        return trainer

    trainers = run_in_threads([lambda t=t: train(t) for t in range(2)], timeout=90)
    exported_ids, rows = trainers[0].sparse.export_sparse("feat")
    for t in trainers:
        t.close()
    head = [t.model.head.weight.detach().numpy() for t in trainers]
    changed = one_process(ids, y, batch, steps, change_at, factor)
    kept = one_process(ids, y, batch, steps, change_at, 1.0)

    def close_to(ref):
        want_rows = ref.emb.weight.detach().numpy()[exported_ids.astype(np.int64)]
        want_head = ref.head.weight.detach().numpy()
        return (np.allclose(rows, want_rows, rtol=1e-4, atol=1e-6)
                and all(np.allclose(h, want_head, rtol=1e-4, atol=1e-6) for h in head))

    assert close_to(changed)
    assert not close_to(kept), "the oracle cannot tell the rates apart"
    for off_by_one in (change_at - 1, change_at + 1):      # and the change lands at step k exactly
        assert not close_to(one_process(ids, y, batch, steps, off_by_one, factor)), off_by_one


@pytest.fixture
def fresh_server(monkeypatch):
    """``ps.init()``'s in-process server of a standalone run; a new one per call."""
    made = []

    def make():
        server = build_server(ClusterEnv(role=None, server_id=0), num_trainers=1, watch_peers=False,
                              in_process=True)
        made.append(server)
        env = ClusterEnv(role="trainer", servers=(server.address,), local_server=server,
                         num_trainers=1, trainer_id=0, timeout=10.0)
        return server, env

    yield make
    for server in made:
        server.close()


def test_a_checkpoint_keeps_the_rate_it_was_taken_with(fresh_server, tmp_path):
    ids, y = make_data()
    batches = [(ids[k * 8:(k + 1) * 8], y[k * 8:(k + 1) * 8]) for k in range(6)]

    def run(stop, resume=None, change_at=2, saves=()):
        server, env = fresh_server()
        model = PsModel()
        with Trainer(model, ps.optim.Momentum(lr=0.1), env=env, resume=resume) as trainer:
            while trainer.step_count < stop:
                if trainer.step_count == change_at:
                    decision = {"decay": 0.5}
                    assert trainer.broadcast(decision) is decision      # one trainer: the value itself
                    trainer.scale_learning_rate(0.5)
                xb, yb = batches[trainer.step_count]
                trainer.step(F.binary_cross_entropy_with_logits(model(xb), yb))
                if trainer.step_count in saves:
                    trainer.save(tmp_path / f"at{trainer.step_count}")
            rows = trainer.sparse.export_sparse("feat")
            scales = (server.dense.lr_scale, server.service(SparseService).tables["feat"].lr_scale)
        return model.head.weight.detach().clone(), rows, scales

    whole_w, whole_rows, scales = run(6, saves=(1, 4))
    assert scales == (0.5, 0.5)
    # After the change: the resumed servers train at the changed rate, as the whole run did.
    resumed_w, resumed_rows, scales = run(6, resume=tmp_path / "at4")
    assert scales == (0.5, 0.5)
    torch.testing.assert_close(resumed_w, whole_w, rtol=0, atol=0)
    np.testing.assert_array_equal(resumed_rows[1], whole_rows[1])
    # Before the change: the old rate, until the script changes it again at step 2.
    _, _, scales = run(2, resume=tmp_path / "at1")
    assert scales == (1.0, 1.0)


def test_mistakes_are_named_before_anything_is_sent(fresh_server):
    _, env = fresh_server()
    model = PsModel()
    with Trainer(model, ps.optim.SGD(lr=0.1), env=env) as trainer:
        for factor in (0, -1.0, float("nan"), 1e7, True, "0.5"):
            with pytest.raises(ConfigError, match="0 < factor <= 1e"):
                trainer.scale_learning_rate(factor)
        with pytest.raises(ConfigError, match="no SparseEmbedding named 'nope'"):
            trainer.scale_learning_rate(0.5, tables=["feat", "nope"])
        with pytest.raises(ConfigError, match="nothing to change"):
            trainer.scale_learning_rate(0.5, tables=False, dense=False)
        with pytest.raises(ConfigError, match="use a list"):
            trainer.broadcast({"ids": (1, 2)})
        trainer.scale_learning_rate(0.5, tables="feat", dense=False)
        server = env.local_server
        assert server.dense.lr_scale == 1.0 and server.service(SparseService).tables["feat"].lr_scale == 0.5
