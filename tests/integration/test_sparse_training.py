"""Sparse tables through real servers, checked against nn.EmbeddingBag in one process."""

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import paramshard as ps
from paramshard.placement.sparse_hash import initial_rows
from paramshard.trainer.trainer import Trainer
from tests.conftest import run_in_threads

VOCAB, DIM, SEED, SCALE = 500, 8, 7, 0.1


class PsModel(nn.Module):
    def __init__(self, optimizer, mode):
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(DIM, 1)      # first, so both models draw the same head
        self.emb = ps.SparseEmbedding("feat", DIM, mode=mode, optimizer=optimizer, seed=SEED, init_scale=SCALE)

    def forward(self, ids):
        return self.head(self.emb(ids)).squeeze(1)


class RefModel(nn.Module):
    def __init__(self, mode):
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(DIM, 1)
        self.emb = nn.EmbeddingBag(VOCAB, DIM, mode=mode, sparse=True)
        with torch.no_grad():   # the servers' deterministic initial rows, id by id
            self.emb.weight.copy_(torch.from_numpy(initial_rows(SEED, np.arange(VOCAB, dtype=np.uint64), DIM, SCALE)))

    def forward(self, ids):
        return self.head(self.emb(ids)).squeeze(1)


def make_data(n=256, bag=6):
    rng = np.random.default_rng(3)
    ids = rng.zipf(1.3, (n, bag)) % VOCAB          # skewed, with many duplicates in each batch
    y = (rng.random(n) < 0.3).astype(np.float32)
    return torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(y)


@pytest.mark.parametrize("loop", ["plain", "prefetching"])
@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("ps_opt,torch_opt", [
    (ps.optim.SGD(lr=0.2), torch.optim.SGD),
    (ps.optim.Adagrad(lr=0.2), torch.optim.Adagrad),
], ids=["sgd", "adagrad"])
def test_sync_sparse_two_trainers_equal_embedding_bag_one_process(cluster, mode, ps_opt, torch_opt, loop):
    """Prefetching (rows of batch k+1 asked for while batch k trains) changes nothing in sync mode."""
    c = cluster(servers=2, trainers=2, mode="sync")
    ids, y = make_data()
    batch, steps = 16, 8

    ref = RefModel(mode)
    emb_opt = torch_opt(ref.emb.parameters(), lr=0.2)
    head_opt = torch.optim.SGD(ref.head.parameters(), lr=0.1)
    for k in range(steps):
        xb, yb = ids[k * 2 * batch:(k + 1) * 2 * batch], y[k * 2 * batch:(k + 1) * 2 * batch]
        emb_opt.zero_grad(), head_opt.zero_grad()
        F.binary_cross_entropy_with_logits(ref(xb), yb).backward()
        emb_opt.step(), head_opt.step()

    dataset = torch.utils.data.TensorDataset(ids, y)
    # Built here, not in the threads: PsModel seeds torch's global RNG, which the
    # threads share, so one thread's manual_seed could land between the other's draws.
    models = [PsModel(ps_opt, mode) for _ in range(2)]

    def trainer_fn(tid):
        model = models[tid]
        trainer = Trainer(model, ps.optim.SGD(lr=0.1), env=c.trainer_env(tid))
        share = ps.shard(dataset, batch_size=batch, trainer_id=tid, num_trainers=2)
        loader = torch.utils.data.DataLoader(share, batch_size=batch)
        for k, (xb, yb) in enumerate(trainer.prefetching(loader) if loop == "prefetching" else loader):
            if k == steps:
                break
            trainer.step(F.binary_cross_entropy_with_logits(model(xb), yb))
        if loop == "prefetching":
            assert trainer.pipeline_stats()["prefetch_hits"] == steps - 2
        return trainer

    trainers = run_in_threads([lambda t=t: trainer_fn(t) for t in range(2)])
    exported_ids, rows = trainers[0].sparse.export_sparse("feat")
    expected = ref.emb.weight.detach().numpy()[exported_ids.astype(np.int64)]
    np.testing.assert_allclose(rows, expected, rtol=1e-4, atol=1e-6)
    initial = initial_rows(SEED, exported_ids, DIM, SCALE)
    assert np.abs(rows - initial).max() > 1e-3, "rows never moved: the oracle would be vacuous"
    for t in trainers:
        np.testing.assert_allclose(t.model.head.weight.detach().numpy(), ref.head.weight.detach().numpy(),
                                   rtol=1e-4, atol=1e-6)
        t.close()


def test_initial_rows_do_not_depend_on_server_count(cluster):
    ids = torch.arange(0, 300).view(30, 10)
    got = []
    for servers in (1, 3):
        c = cluster(servers=servers, trainers=1)
        model = PsModel(ps.optim.SGD(lr=0.1), "sum")
        trainer = Trainer(model, ps.optim.SGD(lr=0.1), env=c.trainer_env(0))
        got.append(trainer.sparse.pull_sparse("feat", ids.numpy().ravel().astype(np.uint64), DIM))
        trainer.close()
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_array_equal(got[0], initial_rows(SEED, np.arange(300, dtype=np.uint64), DIM, SCALE))


def test_duplicate_ids_are_pulled_once_and_their_gradients_merged(cluster):
    c = cluster(servers=2, trainers=1, mode="async")
    model = PsModel(ps.optim.SGD(lr=1.0), "sum")
    trainer = Trainer(model, ps.optim.SGD(lr=0.0001), env=c.trainer_env(0))
    ids = torch.tensor([[5, 5, 5, 9], [9, 5, 11, 11]])
    out = model.emb(ids)
    assert len(model.emb._touched[0][0]) == 3          # 5, 9, 11: pulled once each
    before = trainer.sparse.pull_sparse("feat", np.array([5, 9, 11], np.uint64), DIM)
    out.sum().backward()
    pushed_ids, grads = model.emb.take_gradients()
    np.testing.assert_array_equal(np.sort(pushed_ids), [5, 9, 11])
    counts = {5: 4, 9: 2, 11: 2}                        # gradient of a sum: occurrences x ones
    model.emb._touched = []
    model.emb(ids).sum().backward()
    trainer.step()
    after = trainer.sparse.pull_sparse("feat", np.array([5, 9, 11], np.uint64), DIM)
    for i, fid in enumerate([5, 9, 11]):
        np.testing.assert_allclose(after[i], before[i] - counts[fid], rtol=1e-5)
    stats = trainer.server_stats()
    assert sum(s["sparse_rows"] for s in stats) == 3
    trainer.close()


def test_export_merges_all_servers_and_loads_into_a_new_job(cluster, tmp_path):
    c = cluster(servers=3, trainers=1, mode="async")
    model = PsModel(ps.optim.SGD(lr=0.5), "sum")
    trainer = Trainer(model, ps.optim.SGD(lr=0.1), env=c.trainer_env(0))
    ids, y = make_data(64)
    trainer.step(F.binary_cross_entropy_with_logits(model(ids), y))
    path = tmp_path / "feat.npz"
    n = trainer.export_table("feat", path)
    assert n == len(np.unique(ids.numpy()))
    exported = ps.export.load_table(path)
    live = trainer.sparse.pull_sparse("feat", exported.ids, DIM)
    np.testing.assert_array_equal(exported.lookup(exported.ids), live)
    trainer.close()

    c2 = cluster(servers=2, trainers=1, mode="async")
    model2 = PsModel(ps.optim.SGD(lr=0.5), "sum")
    trainer2 = Trainer(model2, ps.optim.SGD(lr=0.1), env=c2.trainer_env(0))
    assert trainer2.import_table("feat", path) == n
    np.testing.assert_array_equal(trainer2.sparse.pull_sparse("feat", exported.ids, DIM), live)
    trainer2.close()


def test_export_command_against_running_servers(cluster, tmp_path):
    import subprocess
    import sys
    c = cluster(servers=2, trainers=1, mode="async")
    model = PsModel(ps.optim.SGD(lr=0.5), "sum")
    trainer = Trainer(model, ps.optim.SGD(lr=0.1), env=c.trainer_env(0))
    ids, _ = make_data(32)
    model(ids)
    out = tmp_path / "t.npz"
    r = subprocess.run([sys.executable, "-m", "paramshard", "export", "--table", "feat", "--out", str(out),
                        "--servers", ",".join(c.base.servers)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"wrote {len(np.unique(ids.numpy()))} rows" in r.stdout
    r = subprocess.run([sys.executable, "-m", "paramshard", "export", "--table", "nope", "--out", str(out),
                        "--servers", ",".join(c.base.servers)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown sparse table 'nope'" in r.stderr
    trainer.close()


def test_admission_through_the_servers(cluster):
    """min_count=2: a new id reads zeros and learns nothing until its second sighting."""
    c = cluster(servers=2, trainers=1, mode="async")

    class Gated(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = ps.SparseEmbedding("gated", DIM, optimizer=ps.optim.SGD(lr=1.0), seed=SEED,
                                          init_scale=SCALE, admission=ps.Admission(min_count=2))

        def forward(self, ids):
            return self.emb(ids)

    model = Gated()
    trainer = Trainer(model, env=c.trainer_env(0))
    ids = torch.tensor([[3, 4]])
    assert torch.all(model(ids) == 0)                      # first sighting: zeros
    trainer.step(model(ids).sum())                          # second sighting: admitted now
    expected = initial_rows(SEED, np.array([3, 4], np.uint64), DIM, SCALE).sum(0) - 2.0
    np.testing.assert_allclose(model(ids).detach().numpy()[0], expected, rtol=1e-5)
    assert sum(s["sparse_rows"] for s in trainer.server_stats()) == 2
    trainer.close()


def test_evaluation_pulls_create_no_rows(cluster):
    c = cluster(servers=2, trainers=1, mode="async")
    model = PsModel(ps.optim.SGD(lr=0.5), "sum")
    trainer = Trainer(model, ps.optim.SGD(lr=0.1), env=c.trainer_env(0))
    train_ids = torch.tensor([[1, 2]])
    trainer.step(model(train_ids).sum())
    model.eval()
    with torch.no_grad():
        model(torch.tensor([[1, 2, 7, 8]]))
    assert sum(s["sparse_rows"] for s in trainer.server_stats()) == 2      # 7 and 8 not stored
    rows = trainer.sparse.pull_sparse("feat", np.array([7, 2], np.uint64), DIM, create=False)
    np.testing.assert_array_equal(rows[0], initial_rows(SEED, np.array([7], np.uint64), DIM, SCALE)[0])
    assert not np.array_equal(rows[1], initial_rows(SEED, np.array([2], np.uint64), DIM, SCALE)[0])  # trained
    trainer.close()


def test_flat_ids_with_offsets_match_embedding_bag(cluster):
    """The nn.EmbeddingBag calling convention: flat ids + bag offsets, mean pooling."""
    c = cluster(servers=2, trainers=1, mode="async")
    model = PsModel(ps.optim.SGD(lr=0.1), "mean")
    trainer = Trainer(model, env=c.trainer_env(0))
    ids = torch.tensor([4, 9, 4, 17, 3])
    offsets = torch.tensor([0, 2, 3])                     # bags [4, 9], [4], [17, 3]
    ref = RefModel("mean")
    expected = ref.emb(ids, offsets).detach().numpy()
    np.testing.assert_allclose(model.emb(ids, offsets).detach().numpy(), expected, rtol=1e-6)
    trainer.close()
