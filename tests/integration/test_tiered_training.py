"""Training with a memory budget (server/storage/tiered_row_store.py) through an in-process server:
the table's rows spill to the file tier and come back, and the job trains exactly as it does
with every row in RAM (bit-identical weights, rows and optimizer state)."""
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import paramshard as ps
from paramshard.budgets import MIN_BUDGET
from paramshard.env import ClusterEnv
from paramshard.server.assembly import build_server
from paramshard.observe.live.prometheus import ServerCollector
from paramshard.server.services.sparse_service import SparseService
from paramshard.trainer.trainer import Trainer
from paramshard.messages.server_stats import ServerStats

# Starts, stops or kills server processes of its own: `make test` only, not `make check`.
pytestmark = pytest.mark.processes

DIM = 64


class Ctr(nn.Module):
    def __init__(self, budget, dtype=torch.float32):
        super().__init__()
        torch.manual_seed(1)
        self.emb = ps.SparseEmbedding("emb", DIM, optimizer=ps.optim.Adagrad(lr=0.1), init_scale=0.1,
                                      eviction=ps.Eviction(unseen_steps=6), memory_budget=budget, dtype=dtype,
                                      stochastic_rounding=dtype != torch.float32)
        self.head = nn.Linear(DIM * 3 + 2, 1)

    def forward(self, dense, ids):
        e = self.emb(ids.reshape(-1, 1)).view(ids.shape[0], -1)
        return self.head(torch.cat([e, dense], 1)).squeeze(1)


def batches(n=14, b=3000):
    rng = np.random.default_rng(0)
    return [(torch.from_numpy(rng.standard_normal((b, 2)).astype(np.float32)),
             torch.from_numpy((rng.zipf(1.05, (b, 3)) % 400_000).astype(np.int64)),
             torch.from_numpy((rng.random(b) < 0.4).astype(np.float32))) for _ in range(n)]


def train(monkeypatch, tmp_path, budget=None, server_budget=None, dtype=torch.float32):
    run_dir = tmp_path / ("run-" + str(budget) + str(server_budget))
    server = build_server(ClusterEnv(role=None, server_id=0, records=f"dir:{run_dir}",
                                     memory_budget=server_budget), num_trainers=1,
                          watch_peers=False, in_process=True)
    env = ClusterEnv(role="trainer", servers=(server.address,), local_server=server,
                     num_trainers=1, trainer_id=0, timeout=30.0)
    model = Ctr(budget, dtype)
    try:
        with Trainer(model, ps.optim.Adam(lr=0.01), env=env) as trainer:
            for dense, ids, y in trainer.prefetching(batches()):
                trainer.step(F.binary_cross_entropy_with_logits(model(dense, ids), y))
            table = server.service(SparseService).tables["emb"]
            page = table.store.page(0, table.num_rows)
            wire = server.snapshot_stats()
            tier_files = sorted(p.name for p in (run_dir / "tier" / "server-0" / "emb").glob("*")) \
                if (run_dir / "tier").exists() else []
    finally:
        server.close()
        service = server.service(SparseService)
        service.reset()                                       # a table's files go with it...
        assert not (run_dir / "tier" / "server-0" / "emb").exists()
        service.tiers.remove()                                # ...the server's directory at exit
    return model.head.weight.detach().clone(), page, wire, tier_files, run_dir


@pytest.mark.parametrize("budget,server_budget,dtype", [(MIN_BUDGET, None, torch.float32),
                                                        (None, "64MiB", torch.float32),
                                                        (MIN_BUDGET, None, torch.bfloat16)],
                         ids=["table budget", "server budget", "half rows"])
def test_training_with_a_memory_budget_equals_training_without(monkeypatch, tmp_path, budget, server_budget, dtype):
    plain_w, plain_page, _, plain_files, _ = train(monkeypatch, tmp_path, dtype=dtype)
    tier_w, tier_page, wire, tier_files, run_dir = train(monkeypatch, tmp_path, budget, server_budget, dtype)
    torch.testing.assert_close(tier_w, plain_w, rtol=0, atol=0)
    assert list(tier_page) == list(plain_page) and len(plain_page["ids"]) > 20_000
    for part in plain_page:
        np.testing.assert_array_equal(tier_page[part], plain_page[part], err_msg=part)
    assert plain_files == [] and tier_files == ["last_seen.rows", "slot0.rows", "values.rows"]
    assert not (run_dir / "tier").exists()

    stats = ServerStats.from_wire(wire)
    assert ServerStats.from_wire(stats.to_wire()) == stats and stats.to_wire() == wire
    tier = stats.tables["emb"].tier
    assert tier is not None and tier.spills > 0 and 0 < tier.promotions <= tier.spills
    assert 0 <= tier.hit_rate < 1 and tier.budget == (budget or 0)     # 64 MiB < RSS: every row spills
    if server_budget:
        assert stats.sparse.memory_budget == 64 << 20 and stats.sparse.rss_bytes > 0
    else:
        assert tier.resident_bytes <= budget


def test_tier_figures_reach_metrics_and_records():
    from paramshard.observe.live.monitor import server_record
    wire = {"server": 0, "uptime_s": 0.0, "trainers": {"live": [], "left": [], "lost": []}, "phase_seconds": {},
            "sparse_rows": 10, "sparse_bytes": 100, "memory_budget": 1 << 30, "rss_bytes": 5 << 20,
            "tables": {"emb": {"rows": 10, "bytes": 100, "version": 3, "evicted": 0, "dim": 4, "rows_updated": 3,
                               "phase_seconds": {}, "tier": {"budget": 8 << 20, "resident_bytes": 4096, "hits": 3,
                                                             "misses": 1, "spills": 2, "promotions": 1,
                                                             "hit_rate": 0.75}},
                       "plain": {"rows": 1, "bytes": 1, "version": 0, "evicted": 0, "dim": 4, "rows_updated": 0,
                                 "phase_seconds": {}}}}
    stats = ServerStats.from_wire(wire)
    assert stats.to_wire() == wire and stats.tables["plain"].tier is None

    class Server:
        server_id = 0

        def cached_stats(self):
            return wire, 0.5

    samples = {(s.name, s.labels.get("table")): s.value for family in ServerCollector(Server()).collect()
               for s in family.samples}
    assert samples[("paramshard_server_table_tier_hit_rate", "emb")] == 0.75
    assert samples[("paramshard_server_table_tier_spills_total", "emb")] == 2
    assert samples[("paramshard_server_table_resident_bytes", "emb")] == 4096
    assert samples[("paramshard_server_memory_budget_bytes", None)] == 1 << 30
    assert ("paramshard_server_table_tier_hits_total", "plain") not in samples
    record = server_record(stats, None, 1.0, None)
    assert record["tier"] == {"emb": {"budget": 8 << 20, "resident_bytes": 4096, "hit_rate": 0.75, "spills": 2,
                                      "promotions": 1}}
    assert record["memory_budget"] == 1 << 30 and record["rss_bytes"] == 5 << 20
    from paramshard.observe.report.server_table import server_load_table
    assert "tier 'emb' on server 0: hit rate 0.750, 0.0 of 8.0 MiB in RAM, 2 spills, 1 promotions" in \
        server_load_table([wire])


def test_server_processes_with_a_budget_keep_their_tier_in_the_run_directory_and_remove_it(tmp_path):
    """`paramshard server` processes with PARAMSHARD_MEMORY_BUDGET under `paramshard run --run-dir`:
    each keeps its tables' files in <run dir>/tier/server-<id>/, reports the tier in `stats`
    and in its records, and removes the files when it exits."""
    import dataclasses
    import json
    import sys

    from paramshard.launch.engines.local import child_environ
    from paramshard.launch.engines.ports import free_ports
    from paramshard.launch.engines.processes import Child, stop_all

    run_dir = tmp_path / "run"
    base = ClusterEnv(role=None, servers=tuple(f"127.0.0.1:{p}" for p in free_ports(2)), num_trainers=1, mode="sync",
                      timeout=30.0, records=f"dir:{run_dir}")
    children = [Child(f"server {i}", [sys.executable, "-m", "paramshard", "server", "--memory-budget", "2GB"],
                      child_environ(dataclasses.replace(base, role="server", server_id=i)))
                for i in range(2)]
    try:
        model = Ctr(MIN_BUDGET)
        env = dataclasses.replace(base, role="trainer", trainer_id=0)
        with Trainer(model, ps.optim.Adam(lr=0.01), env=env) as trainer:
            for dense, ids, y in batches(n=4, b=500):
                trainer.step(F.binary_cross_entropy_with_logits(model(dense, ids), y))
            stats = [ServerStats.from_wire(s) for s in trainer.server_stats()]
            for i in range(2):
                assert sorted(p.name for p in (run_dir / "tier" / f"server-{i}" / "emb").iterdir()) == \
                    ["last_seen.rows", "slot0.rows", "values.rows"]
    finally:
        stop_all(children, grace=10)
    for s in stats:
        assert s.sparse.memory_budget == 2 * 10**9 and s.sparse.rss_bytes > 0
        assert s.tables["emb"].tier.budget == MIN_BUDGET and s.tables["emb"].tier.hits > 0
    assert not (run_dir / "tier").exists()
    last = json.loads((run_dir / "metrics" / "server-0.jsonl").read_text().splitlines()[-1])
    assert last["tier"]["emb"]["budget"] == MIN_BUDGET and last["memory_budget"] == 2 * 10**9


def test_a_checkpoint_of_a_tiered_table_resumes_where_training_in_ram_ends(monkeypatch, tmp_path):
    """Saved from a table under a budget (its pages read without warming them), restored into
    one (made a piece at a time): the job ends exactly where one with every row in RAM does."""
    data, cut = batches(n=8, b=2000), 4

    def run(stop, budget, save_at=None, resume=None):
        server = build_server(ClusterEnv(role=None, server_id=0), num_trainers=1, watch_peers=False,
                              in_process=True)
        env = ClusterEnv(role="trainer", servers=(server.address,), local_server=server,
                         num_trainers=1, trainer_id=0, timeout=30.0)
        model = Ctr(budget)
        try:
            with Trainer(model, ps.optim.Adam(lr=0.01), env=env, resume=resume) as trainer:
                while trainer.step_count < stop:
                    dense, ids, y = data[trainer.step_count]
                    trainer.step(F.binary_cross_entropy_with_logits(model(dense, ids), y))
                    if trainer.step_count == save_at:
                        trainer.save(tmp_path / "ckpt")
                table = server.service(SparseService).tables["emb"]
                page = table.store.page(0, table.num_rows)
                order = np.argsort(page["ids"])
                state = {part: arr[order] for part, arr in page.items()}
                tier = table.tier_stats()
        finally:
            server.close()
            server.service(SparseService).reset()
        return model.head.weight.detach().clone(), state, tier

    whole_w, whole_state, _ = run(len(data), None)
    run(cut, MIN_BUDGET, save_at=cut)
    resumed_w, resumed_state, tier = run(len(data), MIN_BUDGET, resume=tmp_path / "ckpt")
    torch.testing.assert_close(resumed_w, whole_w, rtol=0, atol=0)
    assert list(resumed_state) == list(whole_state)
    for part in whole_state:
        np.testing.assert_array_equal(resumed_state[part], whole_state[part], err_msg=part)
    assert tier["spills"] > 0
