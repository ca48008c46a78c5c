"""The compiled store with a memory budget (server/storage/tiered_row_store.py): rows in files, the
coldest spilled out of RAM. Oracle: the same calls on an unbounded compiled store give the
same rows, state and handles at every step, however much the tier spills."""
import gc
import os
import threading

import numpy as np
import pytest

from paramshard.budgets import MIN_BUDGET, parse_budget
from paramshard.errors import ConfigError, ProtocolError
from paramshard.optim import SGD, Adagrad, Adam
from paramshard.placement.sparse_hash import initial_rows
from paramshard.server.core.barrier import Membership
from paramshard.server.storage import tiered_row_store
from paramshard.server.storage.compiled_row_store import CompiledRowStore
from paramshard.server.storage.kernels import arena
from paramshard.server.storage.kernels.tier_kernels import compact_range_kernel, stamp_kernel, stamp_range_kernel
from paramshard.server.storage.row_stores import store_named
from paramshard.server.services.sparse_service import SparseService
from paramshard.server.storage.tier_dirs import TierRoot, remove_stale_temp_dirs, table_component
from paramshard.server.storage.tiered_row_store import ServerBudget, TieredRowStore, process_rss
from paramshard.tables import Admission, Eviction, policy_to_wire
from paramshard.transport.protocol import validate_request
from paramshard.update_rules import make_rule

from tests.unit.server.storage.test_row_store import RULES, same    # the rules and the page-by-page comparison of the contract tests


@pytest.fixture
def small_regions(monkeypatch):
    """Regions of a few pages: small tables with many regions."""
    monkeypatch.setattr(tiered_row_store, "REGION_VALUE_BYTES", 4096)


def pair(optimizer, dim, budget, tmp_path, keep_last_seen=True, count=True, row_format=("float32", "nearest"),
         **kwargs):
    rule = make_rule(optimizer)
    fmt = dict(value_dtype=row_format[0], rounding=row_format[1], seed=5)
    plain = CompiledRowStore(dim, rule, keep_last_seen, count, max_rows=1 << 20, capacity=4, **fmt)
    tiered = TieredRowStore(dim, rule, keep_last_seen, count, max_rows=1 << 20, capacity=4, **fmt,
                            memory_budget=budget, tier_dir=tmp_path / "t", **kwargs)
    return plain, tiered


# -- arena.reserve_file --------------------------------------------------------------------------------
def test_a_file_reservation_is_sparse_private_and_reads_back_what_was_dropped(tmp_path):
    path = tmp_path / "v.rows"
    a = arena.reserve_file(path, 1 << 20, (16,), np.float32)
    assert a.shape == (1 << 20, 16) and not a[::4096].any()
    assert os.stat(path).st_size >= (1 << 20) * 64 and os.stat(path).st_blocks * 512 < (1 << 20)   # a hole
    assert a.ctypes.data % arena.FILE_ALIGN == 0          # row 0 on a fault-around boundary
    assert os.stat(path).st_mode & 0o777 == 0o600
    rows = np.random.default_rng(0).standard_normal((4096, 16)).astype(np.float32)
    a[:4096] = rows
    arena.drop(a, 0, 4096)                      # out of the process, not out of the file
    np.testing.assert_array_equal(a[:4096], rows)
    arena.release(a, 1024)                      # past row 1024: punched out, zeros again
    np.testing.assert_array_equal(a[:1024], rows[:1024])
    assert not a[1024:4096].any()


def test_a_dropped_range_gives_its_pages_back_to_the_process(tmp_path):
    a = arena.reserve_file(tmp_path / "v.rows", 1 << 16, (256,), np.float32)     # 64 MiB
    before = process_rss()
    a[:] = 1.0
    filled = process_rss()
    arena.drop(a, 0, len(a))
    assert filled - before > 60 << 20 and process_rss() < filled - (60 << 20)
    assert a.sum(dtype=np.float64) == (1 << 16) * 256


# -- the tier kernels ------------------------------------------------------------------------------------
def test_the_stamp_kernel_counts_hits_misses_and_promotions():
    stamps, heat, promoted = np.zeros(4, np.uint32), np.zeros(4, np.uint32), np.zeros(4, np.uint32)
    spilled = np.array([0, 1, 1, 0], np.uint8)
    rows = np.array([0, 1, 5, 4, -1, 3], np.int64)       # regions of 2 rows (shift 1): 0 0 2 2 - 1
    assert stamp_kernel(rows, 0, len(rows), 1, stamps, heat, spilled, promoted, 7, 10) == (6, 2, 3, 2)
    # rows 0, 1 in region 0 (resident): hits; 5, 4 in region 2 and 3 in region 1 (spilled): misses
    assert spilled.tolist() == [0, 0, 0, 0] and stamps.tolist() == [7, 7, 7, 0] and heat.tolist() == [1, 1, 1, 0]
    assert stamp_kernel(rows, 0, len(rows), 1, stamps, heat, spilled, promoted, 8, 10) == (6, 5, 0, 0)   # -1: no row
    assert heat.tolist() == [2, 2, 2, 0]
    spilled[3] = 1
    assert stamp_range_kernel(5, 8, 1, stamps, heat, spilled, 9) == 1 and stamps.tolist() == [8, 8, 9, 9]
    assert heat.tolist() == [2, 2, 2, 1]                 # a new region starts warm enough to be read


def test_the_stamp_kernel_stops_where_the_budget_has_no_room():
    stamps, heat, promoted = np.zeros(8, np.uint32), np.zeros(8, np.uint32), np.zeros(8, np.uint32)
    spilled = np.ones(8, np.uint8)
    rows = np.array([0, 2, 2, 4, 6, 6], np.int64)        # regions 0 1 1 2 3 3 (shift 1)
    assert stamp_kernel(rows, 0, 6, 1, stamps, heat, spilled, promoted, 1, 2) == (3, 0, 3, 2)
    assert spilled.tolist() == [0, 0, 1, 1, 1, 1, 1, 1]
    assert stamp_kernel(rows, 3, 6, 1, stamps, heat, spilled, promoted, 2, 0) == (4, 0, 1, 1)   # one at least


def test_the_range_compaction_moves_rows_down_in_pieces():
    a = np.arange(20, dtype=np.float32).reshape(10, 2)
    kept = np.array([1, 2, 5, 8, 9])
    compact_range_kernel(a, kept, 0, 2)
    compact_range_kernel(a, kept, 2, 5)
    np.testing.assert_array_equal(a[:5], np.arange(20, dtype=np.float32).reshape(10, 2)[kept])


# -- the oracle ------------------------------------------------------------------------------------------
@pytest.mark.slow_unit(reason="every step of the optimizer's oracle run spills rows to disk and reads them back")
@pytest.mark.parametrize("row_format", [("float32", "nearest"), ("bfloat16", "stochastic")], ids=lambda f: f[0])
@pytest.mark.parametrize("optimizer", RULES, ids=lambda o: o.kind)
def test_a_tiny_budget_spills_constantly_and_changes_nothing(optimizer, row_format, tmp_path, small_regions):
    dim = 5
    plain, tiered = pair(optimizer, dim, budget=1 << 20, tmp_path=tmp_path, row_format=row_format)
    tiered._chunk = 333                                    # large calls in many pieces
    rng = np.random.default_rng(3)
    for version in range(24):
        ids = (rng.zipf(1.05, 3000) % 100_000).astype(np.uint64)
        for store in (plain, tiered):
            if version % 3 == 1:                           # the other way rows are made
                new = np.unique(ids)
                new = new[store.lookup(new) < 0]
                store.create(new, initial_rows(5, new, dim, 0.1), version)
                rows = store.lookup(ids)
            else:
                rows = store.lookup_or_create(ids, version, 5, 0.1)
            np.testing.assert_array_equal(store.gather(rows[:50]), store.gather(rows[:50]))
            distinct = np.unique(rows)
            store.update(distinct, np.cos(distinct[:, None] + np.arange(dim)).astype(np.float32), 0.5, version)
            store.touch(distinct[::2], version)
            if version % 5 == 4:
                store.set_values(distinct[:7], np.full((7, dim), version, np.float32))
            store.count(np.unique(ids)[:5])
        np.testing.assert_array_equal(tiered.lookup(ids), plain.lookup(ids))
        np.testing.assert_array_equal(tiered.gather(tiered.lookup(ids)), plain.gather(plain.lookup(ids)))
        if version % 7 == 6:
            assert tiered.evict_unseen(version - 4) == plain.evict_unseen(version - 4)
        same(tiered, plain)
    stats = tiered.tier_stats()
    assert tiered.num_rows > 5 * tiered.region_rows             # many regions, most of them spilled...
    assert stats["spills"] > 100 and 0 < stats["promotions"] <= stats["spills"] and stats["misses"] > 0
    assert np.array_equal(tiered.counters()[0], plain.counters()[0])


def test_a_restored_page_round_trips_through_a_tiered_store(tmp_path):
    plain, tiered = pair(Adam(lr=0.01), 4, budget=1 << 20, tmp_path=tmp_path)
    ids = np.arange(1, 30_001, dtype=np.uint64)
    plain.lookup_or_create(ids, 0, 1, 0.1)
    plain.update(plain.lookup(ids[::3]), np.ones((10_000, 4), np.float32), 1.0)
    page = plain.page(0, plain.num_rows)
    tiered._chunk = 4000
    tiered.create(page["ids"], page["values"], 0, {k: v for k, v in page.items() if k not in ("ids", "values")})
    same(tiered, plain)
    assert tiered.tier_stats()["spills"] > 0


@pytest.mark.parametrize("optimizer", RULES, ids=lambda o: o.kind)
def test_rows_move_out_of_a_tiered_store_spilled_ones_too(optimizer, tmp_path, small_regions):
    # A server move: the old owner pages the rows out (migrate_page), hands the dirty ones over
    # whole (handoff_rows: gather and state), then drops what it handed away; the new owner makes
    # them rows (create with their state). Oracle: the unbounded compiled store, call for call.
    dim = 3
    plain, tiered = pair(optimizer, dim, budget=1 << 20, tmp_path=tmp_path / "old")
    _, taker = pair(optimizer, dim, budget=1 << 20, tmp_path=tmp_path / "new")
    tiered._chunk = taker._chunk = 500
    rng = np.random.default_rng(8)
    ids = np.arange(1, 40_001, dtype=np.uint64)
    for version in range(3):
        for store in (plain, tiered):
            rows = store.lookup_or_create(ids, version, 5, 0.1)
            store.update(rows[::2], np.full((len(rows[::2]), dim), version + 1, np.float32), 0.5, version)
            store.touch(rows[::3], version)
            store.count(np.arange(10**6, 10**6 + 5, dtype=np.uint64))
    assert tiered.tier_stats()["spills"] > 0 and tiered._spilled_count > 0     # rows on disk only
    moving = ids[rng.random(len(ids)) < 0.4]
    page = tiered.page(0, tiered.num_rows)
    want = plain.page(0, plain.num_rows)
    for name in want:
        np.testing.assert_array_equal(page[name], want[name], err_msg=name)
    mine = np.isin(page["ids"], moving)
    rows = tiered.lookup(page["ids"][mine])
    state = tiered.state_of(rows)
    np.testing.assert_array_equal(tiered.gather(rows), page["values"][mine])
    taker.create(page["ids"][mine], tiered.gather(rows), 2, state)
    assert tiered.drop(moving) == plain.drop(moving) == len(moving)
    # What stays: the same rows and state by id. Not the same handles: the compiled store fills the
    # gaps with its last rows (RowStore.drop), the tiered one compacts in order, as its eviction does
    # (moving spilled rows into gaps would page them in one by one).
    same_by_id(tiered, plain)
    assert tiered.lookup(moving).max() == -1 and tiered.num_rows == len(ids) - len(moving)
    got = taker.page(0, taker.num_rows)
    for name in got:
        np.testing.assert_array_equal(got[name], {k: v[mine] for k, v in page.items()}[name], err_msg=name)
    # The store goes on as before: rows made, updated and evicted after the drop match too.
    for store in (plain, tiered):
        rows = store.lookup_or_create(ids[::5], 3, 5, 0.1)
        store.update(np.unique(rows), np.ones((len(np.unique(rows)), dim), np.float32), 0.5, 3)
    assert tiered.evict_unseen(1) == plain.evict_unseen(1)
    same_by_id(tiered, plain)
    assert tiered.drop(ids[:0]) == 0


def same_by_id(a, b):
    """``same``, whatever order the rows are in."""
    assert a.num_rows == b.num_rows
    pa, pb = a.page(0, a.num_rows + 1), b.page(0, b.num_rows + 1)
    assert list(pa) == list(pb)
    oa, ob = np.argsort(pa["ids"], kind="stable"), np.argsort(pb["ids"], kind="stable")
    for name in pa:
        np.testing.assert_array_equal(pa[name][oa], pb[name][ob], err_msg=name)


# -- residency ---------------------------------------------------------------------------------------------
@pytest.mark.slow_unit(reason="fills fifty memory budgets with rows to read the process's RSS after each")
def test_filling_fifty_budgets_keeps_the_estimate_and_the_rss_within_the_budget(tmp_path):
    budget = 16 << 20
    dim = 2048                                            # fat rows: the ids and index stay a small part
    store = TieredRowStore(dim, make_rule(Adagrad(lr=0.1)), False, False, max_rows=1 << 18, capacity=16,
                           memory_budget=budget, tier_dir=tmp_path / "t")
    grads = np.ones((1000, dim), np.float32)
    gc.collect()
    base = process_rss()
    worst = 0
    filled = 0
    rng = np.random.default_rng(0)
    sampled, done = [0], threading.Event()

    def sample():                 # between pieces of a call too (a kernel holds the GIL: not inside one)
        while not done.wait(0.001):
            sampled[0] = max(sampled[0], process_rss() - base)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    while filled < 50 * budget:
        start = store.num_rows
        rows = store.lookup_or_create(np.arange(start, start + 1000, dtype=np.uint64) + 1, 0, 1, 0.1)
        store.update(rows, grads, 1.0)
        if start:                                           # and some older rows back
            old = np.unique(rng.integers(0, start, 500))
            store.update(old, grads[:len(old)], 1.0)
        filled = store.num_rows * store.bytes_per_row
        assert store.resident_bytes <= budget
        worst = max(worst, process_rss() - base)
    done.set()
    sampler.join()
    # The margin: the test's own arrays (1000 x 2048 floats of gradients: 8 MB) and the allocator's.
    for grown in (worst, sampled[0]):
        assert grown <= budget * 1.02 + (8 << 20), f"RSS grew {grown >> 20} MiB over a {budget >> 20} MiB budget"
    stats = store.tier_stats()
    assert stats["spills"] > 0 and stats["promotions"] <= stats["spills"]


def test_rows_read_back_from_the_tier_are_hits_once_promoted(tmp_path):
    store = TieredRowStore(64, make_rule(SGD(lr=0.1)), False, False, max_rows=1 << 20, memory_budget=MIN_BUDGET,
                           tier_dir=tmp_path / "t")
    store.lookup_or_create(np.arange(1, 200_001, dtype=np.uint64), 0, 1, 0.1)     # 51 MB: mostly spilled
    cold = store.lookup(np.arange(1, 101, dtype=np.uint64))                        # the first rows made
    before = store.tier_stats()
    store.gather(cold)
    after = store.tier_stats()
    assert after["misses"] - before["misses"] == 100 and after["promotions"] - before["promotions"] == 1
    store.gather(cold)
    assert store.tier_stats()["hits"] - after["hits"] == 100
    assert set(store.tier_stats()) == {"budget", "resident_bytes", "hits", "misses", "spills", "promotions"}


def test_a_server_budget_spills_the_coldest_regions_of_all_its_tables(tmp_path):
    rule = make_rule(SGD(lr=0.1))
    budget = ServerBudget(process_rss() + (24 << 20))
    old = TieredRowStore(256, rule, False, False, max_rows=1 << 18, tier_dir=tmp_path / "a", server_budget=budget)
    new = TieredRowStore(256, rule, False, False, max_rows=1 << 18, tier_dir=tmp_path / "b", server_budget=budget)
    old.lookup_or_create(np.arange(1, 20_001, dtype=np.uint64), 0, 1, 0.1)        # 20 MB, first
    new.lookup_or_create(np.arange(1, 20_001, dtype=np.uint64), 0, 1, 0.1)        # 20 MB, later: hotter
    assert old.spills > 0 and old.spills >= new.spills
    assert process_rss() <= budget.budget * 1.02
    assert budget.spills == old.spills + new.spills


# -- files -------------------------------------------------------------------------------------------------
def test_files_are_removed_on_clear_close_and_collection(tmp_path):
    rule = make_rule(Adam(lr=0.01))
    store = TieredRowStore(4, rule, True, False, max_rows=1 << 16, memory_budget=MIN_BUDGET, tier_dir=tmp_path / "t")
    names = sorted(os.listdir(tmp_path / "t"))
    assert names == ["last_seen.rows", "slot0.rows", "slot1.rows", "steps.rows", "values.rows"]
    store.lookup_or_create(np.arange(1, 100, dtype=np.uint64), 0, 1, 0.1)
    old = store.values
    assert os.stat(tmp_path / "t" / "values.rows").st_blocks > 0
    store.clear()
    assert store.num_rows == 0 and os.stat(tmp_path / "t" / "values.rows").st_blocks == 0   # a new, empty file
    assert old[:99].all()                      # ...while a mapping of the old one still reads it
    assert not store.gather(store.lookup_or_create(np.arange(1, 3, dtype=np.uint64), 0, 1, 0.0)).any()
    store.close()
    assert not (tmp_path / "t").exists()
    own = TieredRowStore(4, rule, True, False, max_rows=1 << 16, memory_budget=MIN_BUDGET)   # a temp dir of its own
    where = own.tier_dir
    assert where.is_dir() and str(os.getpid()) in where.name
    del own
    gc.collect()
    assert not where.exists()


def test_a_reset_server_removes_its_tables_files(tmp_path):
    root = TierRoot(tmp_path, 3)
    service = SparseService("sync", Membership(1, 5.0), store=store_named("compiled"), tiers=root)
    header = {"table": "emb", "trainer": 0, "dim": 4, "seed": 1, "optimizer": SGD(lr=0.1).to_wire(),
              "policy": policy_to_wire(Admission(), Eviction(), 0.01), "memory_budget": MIN_BUDGET}
    service.handle_register_sparse(header, [])
    where = tmp_path / "tier" / "server-3" / "emb"
    assert sorted(os.listdir(where)) == ["values.rows"]
    service.handle_pull_sparse({"table": "emb", "trainer": 0, "min_version": 0}, [np.arange(5, dtype=np.uint64)])
    stats = service.stats().tables["emb"].tier
    assert stats.budget == MIN_BUDGET and stats.resident_bytes > 0
    service.reset()
    assert not where.exists()
    root.remove()
    assert not (tmp_path / "tier").exists()


def test_a_killed_servers_tier_is_removed_when_the_next_starts_there(tmp_path):
    stale = tmp_path / "tier" / "server-0" / "emb"
    stale.mkdir(parents=True)
    (stale / "values.rows").write_bytes(b"x")
    root = TierRoot(tmp_path, 0)
    root.remove_stale()
    assert not (tmp_path / "tier" / "server-0").exists()
    gone = tmp_path / "paramshard-tier-999999999-abc"      # no such process
    alive = tmp_path / f"paramshard-tier-{os.getpid()}-abc"
    gone.mkdir()
    alive.mkdir()
    assert remove_stale_temp_dirs(str(tmp_path)) == 1 and alive.exists() and not gone.exists()


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ".hidden", "", "x" * 300, "emb\n", "/abs"])
def test_a_table_name_never_leaves_the_tier_directory(name, tmp_path):
    component = table_component(name)
    assert "/" not in component and component not in (".", "..") and not component.startswith(".")
    path = TierRoot(tmp_path, 0).table_dir(name)
    assert path.parent == tmp_path / "tier" / "server-0" and path.is_dir()
    assert table_component("emb_1.v2") == "emb_1.v2"


# -- budgets ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,size", [("4GB", 4 * 10**9), ("512MiB", 512 << 20), ("1.5G", 3 << 29),
                                       ("64 mb", 64 * 10**6), (1 << 30, 1 << 30), ("8388608", 8 << 20)])
def test_budgets_parse(text, size):
    assert parse_budget(text) == size


@pytest.mark.parametrize("junk", ["4 furlongs", "GB", "-1GB", "1e9", "", True, 1.5, [4], "1MB", 1024])
def test_a_bad_budget_is_refused(junk):
    with pytest.raises(ConfigError, match="memory_budget"):
        parse_budget(junk)


def test_a_bad_budget_is_refused_where_it_is_declared_and_on_the_wire():
    from paramshard.trainer.sparse_embedding import SparseEmbedding
    with pytest.raises(ConfigError, match="'emb': memory_budget"):
        SparseEmbedding("emb", 4, memory_budget="lots")
    assert SparseEmbedding("emb", 4, memory_budget="16MiB").spec.memory_budget == 16 << 20
    header = {"op": "register_sparse", "table": "emb", "dim": 4, "seed": 0, "optimizer": {}, "policy": {},
              "trainer": 0}
    validate_request({**header, "memory_budget": MIN_BUDGET})
    for bad in (MIN_BUDGET - 1, "4GB", True, -5):
        with pytest.raises(ProtocolError, match="memory_budget"):
            validate_request({**header, "memory_budget": bad})


def test_the_numpy_store_refuses_a_budget():
    with pytest.raises(ConfigError, match="compiled"):
        store_named("numpy")(4, make_rule(SGD(lr=0.1)), False, False, max_rows=16, memory_budget=MIN_BUDGET)
    with pytest.raises(ConfigError, match="compiled"):
        SparseService("sync", Membership(1, 5.0), store=store_named("numpy"), memory_budget=MIN_BUDGET)


def test_a_server_budget_travels_from_launch_and_the_environment_to_the_server():
    from paramshard.cli.main import build_parser
    from paramshard.env import ClusterEnv
    from paramshard.launch.api import LaunchConfig
    env = LaunchConfig(module="m", memory_budget="64MiB").base_env(["127.0.0.1:1"])
    assert env.memory_budget == 64 << 20 and env.to_environ()["PARAMSHARD_MEMORY_BUDGET"] == str(64 << 20)
    assert ClusterEnv.from_environ({"PARAMSHARD_MEMORY_BUDGET": "1.5G"}).memory_budget == 3 << 29
    with pytest.raises(ConfigError, match="PARAMSHARD_MEMORY_BUDGET='lots'"):
        ClusterEnv.from_environ({"PARAMSHARD_MEMORY_BUDGET": "lots"})
    assert build_parser().parse_args(["launch", "--memory-budget", "4GB", "train.py"]).memory_budget == 4 * 10**9
