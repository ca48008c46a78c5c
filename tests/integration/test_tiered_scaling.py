"""A table with a memory budget moves between servers: exact sums across 2 -> 3 -> 2 (issue 29 item 4).

As tests/integration/test_server_scaling.py, with the table tiered (server/storage/tiered_row_store.py):
SGD(lr=1), integer rows and gradients, so every row must end exactly at
``initial - sum(gradients pushed)``. The table holds more rows than its budget keeps in RAM, so
rows are spilled to the tier's files while they are copied, handed off and dropped; a third
server (started as the launcher would) takes its share, then server 1 (one of the job's first)
gives all of its rows away. The new server makes its table tiered with the same budget.
"""
from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

import paramshard as ps
from paramshard.client.control import server_stats
from paramshard.client.sparse import SparseClient, TableSpec
from paramshard.env import ClusterEnv
from paramshard.errors import DeadlineExceeded, ServerUnavailable
from paramshard.launch.engines.local import child_environ
from paramshard.launch.engines.ports import free_ports
from paramshard.launch.engines.processes import Child, stop_all
from paramshard.launch.elastic.server_scaling import move_partitions
from paramshard.placement.partitions import Routing
from paramshard.transport.links import ServerLinks
from tests.conftest import run_in_threads

# Starts, stops or kills server processes of its own: `make test` only, not `make check`.
pytestmark = pytest.mark.processes

TRAINERS, PARTITIONS, TIMEOUT = 3, 256, 30.0
TABLE, DIM, ROWS, BATCH, GRAD, INITIAL = "emb", 8, 200_000, 256, 3, 100
BUDGET = "8MiB"         # the smallest budget; the rows take more (values and slot: 64 bytes a row in the files)
MIN_STEPS, MAX_STEPS = 20, 3000


@pytest.mark.timeout(180)
def test_a_budgeted_table_keeps_exact_sums_while_servers_go_2_3_2():
    addresses = [f"127.0.0.1:{p}" for p in free_ports(3)]
    children = []
    for i, known in ((0, 2), (1, 2), (2, 3)):
        env = ClusterEnv(role="server", server_id=i, servers=tuple(addresses[:known]), num_trainers=TRAINERS,
                         mode="async", timeout=TIMEOUT, partitions=PARTITIONS)
        children.append(Child(f"server {i}", [sys.executable, "-m", "paramshard", "server"],
                              child_environ(env)))
    rng = np.random.default_rng(29)
    ids = np.unique(rng.integers(1, 2**63, ROWS + 1000, dtype=np.uint64))[:ROWS]
    initial = rng.integers(-INITIAL, INITIAL + 1, (len(ids), DIM)).astype(np.float32)
    spec = TableSpec(TABLE, DIM, ps.optim.SGD(lr=1.0), init_scale=0.0, memory_budget=BUDGET)
    routing = Routing.initial(PARTITIONS, addresses[:2])
    done, records = threading.Event(), []
    try:
        chief = ServerLinks(addresses[:2], timeout=TIMEOUT)
        chief.wait_ready(60)
        chief_sparse = SparseClient(chief, 0, routing)
        chief_sparse.register_sparse(spec)
        chief_sparse.import_sparse(TABLE, ids, initial)

        def trainer(t: int):
            links = ServerLinks(addresses[:2], timeout=TIMEOUT)
            sparse = SparseClient(links, t, routing)
            trng = np.random.default_rng(100 + t)
            sums = np.zeros((len(ids), DIM), np.int64)
            step = 0
            while step < MAX_STEPS and (step < MIN_STEPS or not done.is_set()):
                at = np.sort(trng.choice(len(ids), BATCH, replace=False))
                sparse.pull_sparse(TABLE, ids[at], DIM)
                g = trng.integers(-GRAD, GRAD + 1, (BATCH, DIM))
                sums[at] += g
                sparse.push_sparse(TABLE, ids[at], g.astype(np.float32), step)
                step += 1
            return links, sums, sparse.resent

        def scaler():
            try:
                with ServerLinks(addresses[:2], timeout=TIMEOUT) as links:
                    links.wait_ready(60)
                    records.append(move_partitions(links, addresses, [0, 1, 2], per_handoff=16, page_rows=20_000))
                    records.append(move_partitions(links, addresses, [0, 2], per_handoff=16, page_rows=20_000))
            finally:
                done.set()
            return None, 0, 0

        results = run_in_threads([lambda t=t: trainer(t) for t in range(TRAINERS)] + [scaler], timeout=150)
        up, down = records
        assert up.partitions == PARTITIONS // 3 and down.rows > 0, (up, down)
        assert sum(r[2] for r in results[:TRAINERS]) > 0, "no request was refused as moved: the move was not live"
        # Server 1 left the routing: while the trainers still hold their links to it, it stays up
        # and must hold nothing; once they let go of it, it exits by itself (code 0), below. The
        # rows are read from the two servers that stay.
        assert _rows_of_a_retired_server(children[1], addresses[1]) == 0, "server 1 still holds rows after the scale-down"
        with ServerLinks([addresses[0], addresses[2]], timeout=TIMEOUT) as reader:
            kept = [reader.request(s, {"op": "export_sparse", "table": TABLE})[1] for s in range(2)]
            stats = server_stats(reader)
        tiers = [s["tables"][TABLE].get("tier") for s in stats]
        assert all(t is not None and t["budget"] == 8 << 20 for t in tiers), tiers
        assert sum(t["spills"] for t in tiers if t) > 0, f"no row was spilled to the tier: {tiers}"
        got_ids = np.concatenate([kept[0][0], kept[1][0]])
        got = np.concatenate([kept[0][1], kept[1][1]]).astype(np.int64)
        assert len(np.unique(got_ids)) == len(got_ids), "a row is held by two servers"
        order = np.argsort(got_ids)
        assert np.array_equal(got_ids[order], np.sort(ids)), "rows lost or made"
        want = initial.astype(np.int64) - sum(r[1] for r in results[:TRAINERS])
        want = want[np.argsort(ids)]
        bad = np.flatnonzero((got[order] != want).any(axis=1))
        assert not len(bad), f"{len(bad)} rows are not initial - sum(grads) (lost or doubled updates), e.g. " \
                             f"{got[order][bad[0]].tolist()} vs {want[bad[0]].tolist()}"
        for links, _, _ in results[:TRAINERS]:
            links.close()
        chief.close()
        code = _exit_of_a_retired_server(children[1])
        assert code == 0, (f"server 1 exited with code {code}" if code is not None else
                           f"server 1 did not exit within {TIMEOUT} s of the trainers closing their links to it")
    finally:
        stop_all(children, grace=3)


def _rows_of_a_retired_server(child: Child, address: str) -> int:
    """The rows a server removed by a scale still holds while trainers keep their links to it (it
    has no reason to exit yet: none let go of it): 0, or it exited cleanly by itself."""
    try:
        with ServerLinks([address], timeout=TIMEOUT) as links:
            return len(links.request(0, {"op": "export_sparse", "table": TABLE})[1][0])
    except (ServerUnavailable, DeadlineExceeded):
        if child.proc.poll() is None:
            raise
        assert child.proc.returncode == 0, f"server 1 exited with code {child.proc.returncode}"
        return 0


def _exit_of_a_retired_server(child: Child) -> int | None:
    """A server removed by a scale exits by itself once every trainer closed its link to it (each
    closing counts as that trainer leaving it: server/core/parameter_server.py): its exit code."""
    try:
        return child.proc.wait(TIMEOUT)
    except subprocess.TimeoutExpired:
        return None
