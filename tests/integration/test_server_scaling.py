"""Servers added and removed while 8 async trainers push a known sum (issue 24, item 3).

As tests/integration/test_exact_sums.py: SGD(lr=1), integer rows and gradients, so every
row must end exactly at ``initial - sum(gradients pushed)`` whatever order the pushes were
applied in; a push lost or applied twice during a move shows as an inexact row. The job
starts on 2 servers with 256 virtual partitions; while the trainers push, a third server
(started by hand, as the launcher would) takes a third of the partitions and of the dense
bytes, then the job goes back to 2 servers: without server 2, or without server 1 (one of the
job's first two, so its dense blocks move to the others). Dense parameters are summed the same
way: each ends exactly at ``initial - sum(dense gradients)``.
"""
from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import paramshard as ps
from paramshard.client.dense import DenseClient
from paramshard.client.sparse import SparseClient, TableSpec
from paramshard.env import ClusterEnv
from paramshard.errors import DeadlineExceeded, ServerUnavailable
from paramshard.launch.engines.local import child_environ
from paramshard.launch.engines.ports import free_ports
from paramshard.launch.engines.processes import Child, stop_all
from paramshard.launch.elastic.server_scaling import move_partitions, scale_servers
from paramshard.placement.partitions import Routing
from paramshard.placement.sharding import ParamSpec, make_plan
from paramshard.transport.links import ServerLinks
from tests.conftest import run_in_threads

# Starts, stops or kills server processes of its own: `make test` only, not `make check`.
pytestmark = pytest.mark.processes

TRAINERS, PARTITIONS, TIMEOUT = 8, 256, 20.0
TABLE, DIM, SHARED, OWN, GRAD, INITIAL = "emb", 4, 512, 32, 3, 100
MIN_STEPS, MAX_STEPS = 30, 3000
DELTA_SECONDS = 0.25      # many deltas while partitions and blocks move
PLAN = make_plan([ParamSpec("w", (96, 4)), ParamSpec("b", (64,))], 2, min_block_size=16)


def _servers(addresses: list[str], deltas) -> list[Child]:
    """Servers 0 and 1 of a 2-server job, and server 2 started for the scale-up (it knows 3); all
    publish deltas into ``deltas`` (issue 33) every DELTA_SECONDS, moves included."""
    children = []
    for i, known in ((0, 2), (1, 2), (2, 3)):
        env = ClusterEnv(role="server", server_id=i, servers=tuple(addresses[:known]), num_trainers=TRAINERS,
                         mode="async", timeout=TIMEOUT, partitions=PARTITIONS, delta_dir=str(deltas),
                         delta_seconds=DELTA_SECONDS)
        children.append(Child(f"server {i}", [sys.executable, "-m", "paramshard", "server"],
                              child_environ(env)))
    return children


@pytest.mark.timeout(120)
@pytest.mark.parametrize("down", [[0, 1], [0, 2]], ids=["remove-server-2", "remove-server-1"])
def test_exact_sums_while_servers_go_2_3_2(down, tmp_path):
    addresses = [f"127.0.0.1:{p}" for p in free_ports(3)]
    children = _servers(addresses, tmp_path / "deltas")
    rng = np.random.default_rng(24)
    shared = np.unique(rng.integers(0, 2**63, SHARED * 2, dtype=np.uint64))[:SHARED]
    shared_initial = rng.integers(-INITIAL, INITIAL + 1, (SHARED, DIM)).astype(np.float32)
    spec = TableSpec(TABLE, DIM, ps.optim.SGD(lr=1.0), init_scale=0.0)
    routing = Routing.initial(PARTITIONS, addresses[:2])
    moves_done = threading.Event()
    records, events = [], []
    try:
        chief = ServerLinks(addresses[:2], timeout=TIMEOUT)
        chief.wait_ready(30)
        chief_sparse = SparseClient(chief, 0, routing)
        chief_sparse.register_sparse(spec)
        chief_sparse.import_sparse(TABLE, shared, shared_initial)
        dense_initial = {"w": rng.integers(-INITIAL, INITIAL + 1, 384).astype(np.float32),
                         "b": rng.integers(-INITIAL, INITIAL + 1, 64).astype(np.float32)}
        DenseClient(chief, PLAN, 0).register_dense(dense_initial, ps.optim.SGD(lr=1.0))

        def trainer(t: int):
            links = ServerLinks(addresses[:2], timeout=TIMEOUT)
            sparse = SparseClient(links, t, routing)
            dense = DenseClient(links, PLAN, t)
            dense.follow(sparse)
            dense_sums = {n: np.zeros(len(a), np.int64) for n, a in dense_initial.items()}
            trng = np.random.default_rng(100 + t)
            own = (np.arange(OWN, dtype=np.uint64) + np.uint64(1 << 40) * np.uint64(t + 1))
            sums: dict[int, np.ndarray] = {}
            step = 0
            while step < MAX_STEPS and (step < MIN_STEPS or not moves_done.is_set()):
                ids = np.sort(np.concatenate([shared[trng.choice(SHARED, 48, replace=False)],
                                              own if step == 0 else own[trng.choice(OWN, 4, replace=False)]]))
                rows = sparse.pull_sparse(TABLE, ids, DIM)
                assert rows.shape == (len(ids), DIM)
                g = trng.integers(-GRAD, GRAD + 1, (len(ids), DIM))
                for i, row in zip(ids.tolist(), g):
                    sums[i] = sums.get(i, 0) + row
                sparse.push_sparse(TABLE, ids, g.astype(np.float32), step)
                dense_grads = {n: trng.integers(-GRAD, GRAD + 1, len(a)) for n, a in dense_initial.items()}
                for n, d in dense_grads.items():
                    dense_sums[n] += d
                dense.push_dense({n: d.astype(np.float32) for n, d in dense_grads.items()}, step)
                step += 1
            return links, (sums, dense_sums), step, (sparse.resent, dense.resent)

        def scaler():
            links = ServerLinks(addresses[:2], timeout=TIMEOUT)
            try:
                links.wait_ready(30)
                records.append(move_partitions(links, addresses, [0, 1, 2], per_handoff=8, page_rows=256))
                # The launcher's call, with the job's settings and its run directory's events.
                job = ClusterEnv(role=None, servers=tuple(addresses[:2]), num_trainers=TRAINERS, mode="async",
                                 timeout=TIMEOUT, partitions=PARTITIONS)
                records.append(scale_servers(job, addresses, down, event=lambda *a, **f: events.append((a, f)),
                                             per_handoff=8, page_rows=256))
            finally:
                moves_done.set()
                links.close()
            return None, ({}, {}), 0, (0, 0)

        results = run_in_threads([lambda t=t: trainer(t) for t in range(TRAINERS)] + [scaler], timeout=100)
        up, down_servers, down = records[0], down, records[1]
        removed = ({0, 1, 2} - set(down_servers)).pop()
        assert up.partitions == PARTITIONS // 3 and down.partitions == PARTITIONS // 3, (up, down)
        assert up.rows > 0 and down.rows > 0
        assert [a[0] for a, _ in events] == ["scale_start", "scale_end"]
        assert events[1][1]["partitions"] == down.partitions and events[1][1]["servers_after"] == down_servers
        assert up.blocks > 0 and down.blocks > 0 and up.dense_bytes > 0, (up, down)

        want = {int(i): v.astype(np.int64) for i, v in zip(shared, shared_initial)}
        for _, (sums, _), _, _ in results[:TRAINERS]:
            for i, s in sums.items():
                want[i] = want.get(i, np.zeros(DIM, np.int64)) - s
        # The removed server left the routing: once every trainer's links let go of it (they do as
        # soon as they learn the routing that retires it) it exits by itself, code 0, and until then
        # it must hold nothing. Asked after its exit, it is gone: both are right.
        rows_left, blocks_left = _held_by_a_retired_server(children[removed], addresses[removed])
        assert rows_left == 0, f"server {removed} still holds rows after the scale-down"
        assert not blocks_left, f"server {removed} still holds dense blocks {sorted(blocks_left)[:3]}"
        reader = ServerLinks(addresses, timeout=TIMEOUT)
        try:
            per_server = [reader.request(s, {"op": "export_sparse", "table": TABLE})[1] if s != removed else None
                          for s in range(3)]
            held = [reader.request(s, {"op": "dense_held"})[0]["blocks"] if s != removed else [] for s in range(3)]
            router = SparseClient(reader, 0, routing)
            router.refresh_routing()
            final = DenseClient(reader, PLAN, 0)
            final.follow(router)
            dense_values = {n: np.zeros_like(a) for n, a in dense_initial.items()}
            final.pull_dense(dense_values, 0)
        finally:
            reader.close()
        assert sorted(n for h in held for n in h) == sorted(b.name for b in PLAN.blocks), "a block lost or doubled"
        assert set(router.routing.blocks.values()) == set(down_servers)
        for n, initial in dense_initial.items():
            want_dense = initial.astype(np.int64) - sum(r[1][1][n] for r in results[:TRAINERS])
            wrong = np.flatnonzero(dense_values[n].astype(np.int64) != want_dense)
            assert not len(wrong), f"dense {n}: {len(wrong)} values are not initial - sum(grads), e.g. [{wrong[0]}] " \
                                   f"{dense_values[n][wrong[0]]} vs {want_dense[wrong[0]]}"
        ids = np.concatenate([p[0] for s, p in enumerate(per_server) if s != removed])
        values = np.concatenate([p[1] for s, p in enumerate(per_server) if s != removed])
        assert len(np.unique(ids)) == len(ids), "a row is held by two servers"
        assert sorted(ids.tolist()) == sorted(want), "rows lost or made"
        got = dict(zip(ids.tolist(), values.astype(np.int64)))
        bad = [i for i in want if not np.array_equal(got[i], want[i])]
        assert not bad, f"{len(bad)} rows are not initial - sum(grads) (lost or doubled updates), e.g. id " \
                        f"{bad[0]}: got {got[bad[0]].tolist()}, want {want[bad[0]].tolist()}"
        assert sum(r[3][0] for r in results[:TRAINERS]) > 0, "no request was refused as moved: the move was not live"
        assert sum(r[3][1] for r in results[:TRAINERS]) > 0, "no dense request was refused as moved"
        for links, _, _, _ in results[:TRAINERS]:
            links.close()
        chief.close()
        _a_joiner_learns_the_retired_server_then_it_exits(addresses, routing, removed, down.routing_version,
                                                          shared, want, children)
        stop_all(children, grace=20)          # every trainer left: each server published its last delta
        _the_model_rebuilt_from_the_deltas_is_what_the_trainers_pushed(tmp_path / "deltas", want, dense_initial,
                                                                       results)
    finally:
        stop_all(children, grace=3)


def _held_by_a_retired_server(child: Child, address: str) -> tuple[int, list]:
    """(rows, dense blocks) a server removed by a scale still holds: nothing, or it exited cleanly
    by itself (its trainers let go of it) before it was asked."""
    try:
        with ServerLinks([address], timeout=TIMEOUT) as links:
            rows = len(links.request(0, {"op": "export_sparse", "table": TABLE})[1][0])
            return rows, links.request(0, {"op": "dense_held"})[0]["blocks"]
    except (ServerUnavailable, DeadlineExceeded):
        if child.proc.poll() is None:
            raise
        assert child.proc.returncode == 0, f"the removed server exited with code {child.proc.returncode}"
        return 0, []


def _the_model_rebuilt_from_the_deltas_is_what_the_trainers_pushed(deltas, want, dense_initial, results):
    """Issue 33: what the servers published while partitions and blocks moved between them,
    rebuilt (each server's latest snapshot and deltas after it, servers merged in the order their
    files were written: online/rebuild.py), holds every row and dense value exactly: a row that
    moved is taken from its new owner's files, never overwritten by its old owner's older one."""
    from paramshard.online.rebuild import rebuild
    model = rebuild(deltas)
    assert sorted(model.seqs) == [0, 1, 2]
    ids, rows = model.table(TABLE)
    assert sorted(ids.tolist()) == sorted(want), "the deltas lost or made rows"
    bad = [int(i) for i, row in zip(ids, rows) if not np.array_equal(row.astype(np.int64), want[int(i)])]
    assert not bad, f"{len(bad)} rebuilt rows are not initial - sum(grads), e.g. id {bad[0]}: " \
                    f"{model.tables[TABLE][bad[0]].tolist()} vs {want[bad[0]].tolist()}"
    for block in PLAN.blocks:
        want_dense = dense_initial[block.param].astype(np.int64) - sum(r[1][1][block.param] for r in results[:TRAINERS])
        got = model.dense[block.name].astype(np.int64)
        assert np.array_equal(got, want_dense[block.offset:block.offset + block.size]), f"dense block {block.name}"


def _a_joiner_learns_the_retired_server_then_it_exits(addresses, routing, removed, version, shared, want, children):
    """Issue 29: a trainer that starts now (a joiner, a replacement) knows the job's first two
    servers only and learns a routing naming ``removed`` retired (""): it connects to nothing for
    it (a joiner died of 'tcp://'), reads every row right, and joins and leaves without it. Once
    every trainer let go of it, the removed server exits."""
    from paramshard.client import control
    links = ServerLinks(addresses[:2], timeout=TIMEOUT)
    try:
        joiner = SparseClient(links, 0, routing)
        joiner.refresh_routing()
        assert joiner.routing.addresses[removed] == "" and links.is_retired(removed) and len(links) == 3
        assert links.live() == [s for s in range(3) if s != removed]
        for t in range(TRAINERS):       # every trainer's requests now carry the routing that retires it
            rows = SparseClient(links, t, joiner.routing).pull_sparse(TABLE, shared, DIM, create=False)
            assert np.array_equal(rows.astype(np.int64), np.stack([want[int(i)] for i in shared]))
        assert len(control.server_stats(links)) == 2
        # Every trainer let go of it (their links closed; the joiner never connected to it): a retired
        # server takes their going as leaves, not losses, and exits by itself, before the launcher's
        # step would tell it to (launch/elastic/elastic_servers.py: stop_when_unneeded, for one a trainer
        # still holds a link to).
        # It exits by itself, however long a loaded machine takes to see its trainers go (not a timing).
        assert children[removed].proc.wait(timeout=60) == 0, f"server {removed} did not exit once retired"
        assert all(c.proc.poll() is None for i, c in enumerate(children) if i != removed)
    finally:
        links.close()
