"""A script run without a cluster trains against a server inside its own process
(server/core/in_process.py): direct calls, no sockets. Oracle: it trains exactly as the
same job against a server process does."""
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import paramshard as ps
from paramshard import runtime
from paramshard.checkpoint.format import Checkpoint
from paramshard.env import ClusterEnv
from paramshard.server.assembly import build_server
from paramshard.errors import DeadlineExceeded, RemoteError
from paramshard.server.core.in_process import LocalLinks
from paramshard.server.services.sparse_service import SparseService
from paramshard.trainer.trainer import Trainer


class Ctr(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.emb = ps.SparseEmbedding("emb", 4, optimizer=ps.optim.Adagrad(lr=0.1), init_scale=0.1)
        self.head = nn.Linear(4 * 3 + 2, 1)

    def forward(self, dense, ids):
        e = self.emb(ids.reshape(-1, 1)).view(ids.shape[0], -1)
        return self.head(torch.cat([e, dense], 1)).squeeze(1)


def batches(n=12, b=16):
    rng = np.random.default_rng(0)
    return [(torch.from_numpy(rng.standard_normal((b, 2)).astype(np.float32)),
             torch.from_numpy(rng.integers(0, 50, (b, 3))),
             torch.from_numpy((rng.random(b) < 0.4).astype(np.float32))) for _ in range(n)]


def train(env, prefetch: bool):
    model = Ctr()
    with Trainer(model, ps.optim.Adam(lr=0.01), env=env) as trainer:
        data = batches()
        for dense, ids, y in (trainer.prefetching(data) if prefetch else data):
            trainer.step(F.binary_cross_entropy_with_logits(model(dense, ids), y))
        links_type = type(trainer.links)
        rows = trainer.sparse.export_sparse("emb")
        hits = trainer.pipeline_stats()["prefetch_hits"]
    return model.head.weight.detach().clone(), rows, links_type, hits


@pytest.fixture
def in_process(monkeypatch):
    """An in-process server as ``ps.init()`` makes one with no cluster around."""
    server = build_server(ClusterEnv(role=None, server_id=0), num_trainers=1, watch_peers=False, in_process=True)
    yield ClusterEnv(role="trainer", servers=(server.address,), local_server=server,
                     num_trainers=1, trainer_id=0, timeout=10.0)
    server.close()


@pytest.mark.parametrize("prefetch", [False, True])
def test_in_process_training_equals_a_server_process(cluster, in_process, prefetch):
    local_w, local_rows, local_links, local_hits = train(in_process, prefetch)
    c = cluster(servers=1, trainers=1, mode="sync")
    remote_w, remote_rows, remote_links, _ = train(c.trainer_env(0), prefetch)
    assert local_links is LocalLinks and remote_links is not LocalLinks
    torch.testing.assert_close(local_w, remote_w, rtol=0, atol=0)
    np.testing.assert_array_equal(local_rows[0], remote_rows[0])
    np.testing.assert_array_equal(local_rows[1], remote_rows[1])
    if prefetch:    # sync: each prefetched pull waited for the step before it, then was answered
        assert local_hits == len(batches()) - 2


def test_in_process_errors_are_the_servers_error_replies(in_process):
    links = runtime.links_for(in_process)
    with pytest.raises(RemoteError, match="unknown sparse table 'nope'") as caught:
        links.request(0, {"op": "push_sparse", "table": "nope", "trainer": 0, "step": 0},
                      [np.arange(3, dtype=np.uint64), np.zeros((3, 4), np.float32)])
    assert caught.value.code == "invalid"
    with pytest.raises(RemoteError) as caught:
        links.request(0, {"op": "pull_dense", "names": "not a list"})
    assert caught.value.code == "bad_request"


def test_a_reply_nothing_in_the_process_can_complete_is_an_error_not_a_hang(in_process):
    with pytest.raises(DeadlineExceeded, match="has not registered sparse table 'nope'"):
        runtime.links_for(in_process).request(0, {"op": "pull_sparse", "table": "nope", "trainer": 0,
                                                  "min_version": 0}, [np.arange(3, dtype=np.uint64)])
    model = nn.Linear(3, 1)
    with Trainer(model, ps.optim.SGD(lr=0.1), env=in_process) as trainer:
        ticket = trainer.links.submit([(0, {"op": "pull_dense", "names": [b.name for b in trainer.plan.blocks],
                                            "trainer": 0, "min_version": 5,
                                            "plan_fingerprint": trainer.plan.fingerprint()}, ())])
        with pytest.raises(DeadlineExceeded, match="cannot answer.*pull_dense"):
            trainer.links.collect(ticket)


class RowWiseCtr(Ctr):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.emb = ps.SparseEmbedding("emb", 4, optimizer=ps.optim.RowWiseAdagrad(lr=0.1), init_scale=0.1)


def test_a_row_wise_adagrad_table_trains_saves_and_resumes_bit_identical(monkeypatch, tmp_path):
    """RowWiseAdagrad through the whole stack: the Trainer takes it for a table, the table keeps
    one accumulator per row, and a checkpoint resumed on a fresh server ends where an
    uninterrupted run does."""
    data, cut = batches(), 5

    def run(stop, save_at=None, resume=None):
        server = build_server(ClusterEnv(role=None, server_id=0), num_trainers=1, watch_peers=False,
                              in_process=True)
        env = ClusterEnv(role="trainer", servers=(server.address,), local_server=server,
                         num_trainers=1, trainer_id=0, timeout=10.0)
        model = RowWiseCtr()
        try:
            with Trainer(model, ps.optim.Adam(lr=0.01), env=env, resume=resume) as trainer:
                assert trainer.step_count == (cut if resume else 0)
                while trainer.step_count < stop:
                    dense, ids, y = data[trainer.step_count]
                    trainer.step(F.binary_cross_entropy_with_logits(model(dense, ids), y))
                    if trainer.step_count == save_at:
                        trainer.save(tmp_path)
                rows = trainer.sparse.export_sparse("emb")
                table = server.service(SparseService).tables["emb"]
                page = table.store.page(0, table.num_rows)
                order = np.argsort(page["ids"])
                state = {part: arr[order] for part, arr in page.items()}
        finally:
            server.close()
        return model.head.weight.detach().clone(), rows, state

    whole_w, whole_rows, whole_state = run(len(data))
    assert whole_state["slot0"].shape == (len(whole_rows[0]), 1) and (whole_state["slot0"] > 0).all()
    run(cut, save_at=cut)
    ckpt = Checkpoint(tmp_path)
    (entry,) = ckpt.manifest["sparse"]
    assert ckpt.step == cut and entry["optimizer"]["kind"] == "rowwise_adagrad" and "steps" not in entry["files"]
    assert ckpt.array(entry["files"]["slot0"]).shape == (entry["rows"], 1)
    resumed_w, resumed_rows, resumed_state = run(len(data), resume=tmp_path)
    torch.testing.assert_close(resumed_w, whole_w, rtol=0, atol=0)
    for a, b in zip(resumed_rows, whole_rows):
        np.testing.assert_array_equal(a, b)
    assert list(resumed_state) == list(whole_state)
    for part in whole_state:
        np.testing.assert_array_equal(resumed_state[part], whole_state[part], err_msg=part)


class HalfCtr(Ctr):
    def __init__(self, dtype=torch.float16, stochastic=False):
        super().__init__()
        torch.manual_seed(1)
        self.emb = ps.SparseEmbedding("emb", 4, optimizer=ps.optim.Adagrad(lr=0.1), init_scale=0.1, dtype=dtype,
                                      stochastic_rounding=stochastic)


def learnable_batches(n=60, b=64):
    """Labels from a hidden weight per id: a table that learns lowers the loss."""
    rng = np.random.default_rng(4)
    hidden = rng.standard_normal(200) * 1.5
    out = []
    for _ in range(n):
        ids = rng.integers(0, 200, (b, 3))
        y = (rng.random(b) < 1 / (1 + np.exp(-hidden[ids].sum(1)))).astype(np.float32)
        out.append((torch.from_numpy(rng.standard_normal((b, 2)).astype(np.float32)), torch.from_numpy(ids),
                    torch.from_numpy(y)))
    return out


def representable(rows: np.ndarray, dtype) -> bool:
    return np.array_equal(torch.from_numpy(rows).to(dtype).to(torch.float32).numpy(), rows)


@pytest.mark.parametrize("dtype, stochastic", [(torch.float16, False), (torch.bfloat16, True)])
def test_a_half_precision_table_trains_and_its_rows_arrive_as_float32_of_that_precision(in_process, dtype,
                                                                                          stochastic):
    model = HalfCtr(dtype, stochastic)
    losses = []
    with Trainer(model, ps.optim.Adam(lr=0.01), env=in_process) as trainer:
        for dense, ids, y in learnable_batches():
            loss = F.binary_cross_entropy_with_logits(model(dense, ids), y)
            _, pulled = model.emb._touched[-1]               # the rows this forward pulled
            assert pulled.dtype == torch.float32 and representable(pulled.detach().numpy(), dtype)
            trainer.step(loss)
            losses.append(loss.item())
        ids, rows = trainer.sparse.export_sparse("emb")
    assert rows.dtype == np.float32 and representable(rows, dtype) and len(ids) == 200
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.05


def test_a_stochastically_rounded_half_table_resumes_bit_identical(monkeypatch, tmp_path):
    """Stochastic rounding draws its bits from (seed, id, table version, column): a run resumed from
    a checkpoint (which records the row format) rounds as the uninterrupted run did."""
    data, cut = learnable_batches(n=12), 5

    def run(stop, save_at=None, resume=None):
        server = build_server(ClusterEnv(role=None, server_id=0), num_trainers=1, watch_peers=False,
                              in_process=True)
        env = ClusterEnv(role="trainer", servers=(server.address,), local_server=server,
                         num_trainers=1, trainer_id=0, timeout=10.0)
        model = HalfCtr(torch.float16, stochastic=True)
        try:
            with Trainer(model, ps.optim.Adam(lr=0.01), env=env, resume=resume) as trainer:
                while trainer.step_count < stop:
                    dense, ids, y = data[trainer.step_count]
                    trainer.step(F.binary_cross_entropy_with_logits(model(dense, ids), y))
                    if trainer.step_count == save_at:
                        trainer.save(tmp_path)
                rows = trainer.sparse.export_sparse("emb")
        finally:
            server.close()
        return model.head.weight.detach().clone(), rows

    whole_w, whole_rows = run(len(data))
    run(cut, save_at=cut)
    (entry,) = Checkpoint(tmp_path).manifest["sparse"]
    assert (entry["dtype"], entry["rounding"]) == ("float16", "stochastic")
    resumed_w, resumed_rows = run(len(data), resume=tmp_path)
    torch.testing.assert_close(resumed_w, whole_w, rtol=0, atol=0)
    for a, b in zip(resumed_rows, whole_rows):
        np.testing.assert_array_equal(a, b)
