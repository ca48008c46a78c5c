"""Servers publish deltas and snapshots while the job trains (issue 33, server/services/delta_service.py).

Oracle: the model rebuilt from the delta directory alone (online/rebuild.py: each server's latest
snapshot and the deltas after it) equals what the servers hold when the job ends, row for row and
block for block, exactly (float32), or the float16 rounding of every row when asked to quantise;
evicted rows are gone from it (tombstones). Each delta's bytes follow the rows it carries.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import paramshard as ps
from paramshard.inference.serving import read_model
from paramshard.online.delta_format import MAGIC, read_delta
from paramshard.online.delta_log import DeltaLog
from paramshard.online.rebuild import rebuild
from paramshard.server.services.delta_service import DeltaService
from paramshard.server.services.sparse_service import SparseService
from paramshard.tables import Eviction
from paramshard.trainer.trainer import Trainer
from tests.conftest import run_in_threads

DIM, WIDE, BATCH, BAG = 4, 2, 16, 3


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        # Rows unseen for 4 steps go: ids drift, so old ones are evicted while the job trains.
        self.emb = ps.SparseEmbedding("emb", DIM, optimizer=ps.optim.Adagrad(lr=0.1), init_scale=0.1,
                                      eviction=Eviction(unseen_steps=4))
        self.wide = ps.SparseEmbedding("wide", WIDE, optimizer=ps.optim.SGD(lr=0.1), init_scale=0.1)
        self.head = nn.Linear(DIM * BAG + WIDE, 1)

    def forward(self, ids):
        e = self.emb(ids.reshape(-1, 1)).view(ids.shape[0], -1)
        return self.head(torch.cat([e, self.wide(ids[:, :1])], 1)).squeeze(1)


def batches(trainer_id: int, steps: int):
    rng = np.random.default_rng(10 + trainer_id)
    for k in range(steps):
        ids = rng.integers(0, 200, (BATCH, BAG)) + 20 * k        # a window of ids that moves on
        yield torch.from_numpy(ids), torch.from_numpy((rng.random(BATCH) < 0.4).astype(np.float32))


def train(env, steps: int):
    model = Net()
    with Trainer(model, ps.optim.Adam(lr=0.01), env=env) as trainer:
        for ids, y in batches(env.trainer_id, steps):
            trainer.step(F.binary_cross_entropy_with_logits(model(ids), y))
        return {b.name: (b.param, b.offset, b.size) for b in trainer.plan.blocks}


def run_job(cluster, tmp_path, mode="sync", trainers=1, steps=12, servers=2, **deltas):
    root = tmp_path / "deltas"
    # Every 2 pushes a server takes (and every 0.05 s): many deltas and snapshots however fast it trains.
    settings = {"delta_dir": str(root), "delta_seconds": 0.05, "delta_snapshot_every": 4, "delta_updates": 2, **deltas}
    c = cluster(servers=servers, trainers=trainers, mode=mode, **settings)
    plans = run_in_threads([lambda t=t: train(c.trainer_env(t), steps) for t in range(trainers)], timeout=120)
    for server in c.threads:           # every trainer left: each server published its last delta and stopped
        server._thread.join(30)
        assert not server._thread.is_alive(), f"{server.name} did not stop after its trainers left"
    return root, c.threads, plans[0]


def held(servers):
    """What the servers hold: table -> (ids ascending, rows), block -> values."""
    tables: dict[str, list] = {}
    dense = {}
    for server in servers:
        for name, table in server.service(SparseService).tables.items():
            tables.setdefault(name, []).append(table.export())
        dense.update({name: b.values for name, b in server.dense.blocks.items()})
    out = {}
    for name, parts in tables.items():
        ids = np.concatenate([p[0] for p in parts])
        rows = np.concatenate([p[1] for p in parts])
        order = np.argsort(ids)
        out[name] = ids[order], rows[order]
    return out, dense


def check_rebuilt_equals_servers(root, servers, dtype=np.float32):
    tables, dense = held(servers)
    model = rebuild(root)
    assert set(model.tables) == set(tables)
    for name, (ids, rows) in tables.items():
        got_ids, got_rows = model.table(name)
        np.testing.assert_array_equal(got_ids, ids, err_msg=f"table {name}: ids")
        assert got_rows.dtype == dtype
        np.testing.assert_array_equal(got_rows, rows.astype(dtype), err_msg=f"table {name}: rows")
    assert set(model.dense) == set(dense)
    for name, values in dense.items():
        np.testing.assert_array_equal(model.dense[name], values, err_msg=f"block {name}")
    return model


def files(root):
    log = DeltaLog(root)
    return [(s, e) for s in log.servers() for e in log.entries(s)]


def check_sizes(root):
    """Each delta: its payload is its arrays (ids, rows, tombstones, dense blocks) and their alignment only."""
    for _, entry in files(root):
        delta = read_delta(entry.path)
        data = entry.path.read_bytes()
        header = int.from_bytes(data[len(MAGIC):len(MAGIC) + 4], "little")
        arrays = 3 * len(delta.tables) + len(delta.dense)
        row_bytes = delta.row_bytes() + sum(v.nbytes for v in delta.dense.values())
        assert len(data) <= 1.1 * row_bytes + len(MAGIC) + 4 + header + 64 * arrays, entry.path


@pytest.mark.parametrize("mode, trainers", [("sync", 2), ("async", 2)])
def test_a_model_rebuilt_from_the_delta_directory_equals_the_servers(cluster, tmp_path, mode, trainers):
    root, servers, plan = run_job(cluster, tmp_path, mode=mode, trainers=trainers)
    model = check_rebuilt_equals_servers(root, servers)
    published = [read_delta(e.path) for _, e in files(root)]
    assert {s for s, _ in files(root)} == {0, 1}
    assert sum(t.evicted for s in servers for t in s.service(SparseService).tables.values()) > 0
    assert any(len(c.tombstones) for d in published for c in d.tables.values()), "evictions sent no tombstone"
    for server in servers:           # seqs with no gap after the snapshot each server keeps (pruned to 2)
        service = server.service(DeltaService)
        assert service.published["snapshots"] >= 2 and service.published["deltas"] >= 4
        entries = DeltaLog(root).entries(server.server_id)
        assert [e.kind for e in entries].count("snapshot") == 2
    check_sizes(root)
    # The chief's files: the model file, and where each dense block lands in its parameter.
    assert read_model(root / "model.pt").dense.keys() >= {p for p, _, _ in plan.values()}
    layout = json.loads((root / "blocks.json").read_text())
    assert layout == {name: [p, o, n] for name, (p, o, n) in plan.items()}
    assert {name: len(v) for name, v in model.dense.items()} == {name: n for name, (_, _, n) in plan.items()}


def test_quantised_deltas_hold_the_float16_rounding_of_the_rows(cluster, tmp_path):
    root, servers, _ = run_job(cluster, tmp_path, mode="sync", trainers=1, steps=8, delta_fp16=True)
    check_rebuilt_equals_servers(root, servers, dtype=np.float16)
    check_sizes(root)


def test_a_delta_carries_the_rows_touched_since_the_one_before(cluster, tmp_path):
    """A delta after every push: it holds the rows of one batch's push and the next batch's first
    pull at most, never the table (which holds many batches' rows)."""
    root, servers, _ = run_job(cluster, tmp_path, mode="sync", trainers=1, steps=10, delta_updates=1,
                               delta_seconds=1000.0, delta_snapshot_every=1000)
    check_rebuilt_equals_servers(root, servers)
    deltas = [read_delta(e.path) for _, e in files(root) if e.kind == "delta"]
    assert len(deltas) >= 10
    assert max(len(c.ids) for d in deltas for c in d.tables.values()) <= 2 * BATCH * BAG
    rows = sum(s.service(SparseService).tables["emb"].num_rows + s.service(SparseService).tables["emb"].evicted
               for s in servers)
    assert rows > 4 * BATCH * BAG


def test_servers_started_again_go_on_after_the_last_seq_with_a_snapshot(cluster, tmp_path):
    root, _, _ = run_job(cluster, tmp_path, mode="sync", trainers=1, steps=6)
    last = {s: DeltaLog(root).entries(s)[-1].seq for s in (0, 1)}
    # A new job on new servers with the same directory (as servers restarted in place hold only what
    # they were given since): a follower must take their snapshot, not keep the old rows.
    root, servers, _ = run_job(cluster, tmp_path, mode="async", trainers=1, steps=3,
                               delta_snapshot_every=1000)     # no periodic snapshot: none is pruned
    for s in (0, 1):
        after = [e for e in DeltaLog(root).entries(s) if e.seq > last[s]]
        assert after[0].kind == "snapshot" and after[0].seq == last[s] + 1, after[:2]
        seqs = [e.seq for e in after if e.kind == "delta"]
        assert seqs == list(range(last[s] + 2, last[s] + 2 + len(seqs))) and seqs
    check_rebuilt_equals_servers(root, servers)
