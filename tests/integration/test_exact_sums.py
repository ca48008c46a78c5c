"""Exact sums under load: 8 async trainers push integer gradients at once to
dense blocks split over 2 servers and to shared sparse rows; afterwards every
value must be exactly ``initial - sum(all gradients)``.

With SGD(lr=1) an async push is ``value -= grad``. Initial values and
gradients are small integers in float32, so every partial sum is an integer far
below 2**24 and exact whatever order the servers apply the pushes in: any lost,
doubled, torn or misrouted update shows up as an inexact value. The expected
sums are kept in int64 by the test.

Each trainer is a thread with its own ServerLinks (as a trainer process would
have). Sparse rows: a set of ids shared by every trainer (created up front by
an import with integer values) plus ids of each trainer's own (created by its
first pull, at 0 with init_scale=0); every push is preceded by a pull of the
same ids, as the servers require rows to exist.

The default run is 8 x EXACT_STEPS_FAST pushes; ``-m fuzz`` runs 8 x 1000.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

import paramshard as ps
from paramshard.client.dense import DenseClient
from paramshard.client.sparse import SparseClient, TableSpec
from paramshard.placement.sharding import ParamSpec, make_plan
from paramshard.transport.links import ServerLinks
from tests.conftest import run_in_threads

TRAINERS, SERVERS = 8, 2
FULL_STEPS = int(os.environ.get("PARAMSHARD_EXACT_STEPS", "1000"))
FAST_STEPS = int(os.environ.get("PARAMSHARD_EXACT_STEPS_FAST", "200"))
MIN_BLOCK_SIZE = 64
# "w" and "m" are split in two blocks, one per server; "b" is one small block.
PARAMS = [ParamSpec("w", (5000,)), ParamSpec("m", (40, 30)), ParamSpec("b", (10,))]
TABLE, DIM = "emb", 4
SHARED_IDS = 64          # ids every trainer pushes to
OWN_IDS = 16             # ids of one trainer's own
SHARED_PER_STEP, OWN_PER_STEP = 24, 4
GRAD = 3                 # gradients are integers in [-GRAD, GRAD]
INITIAL = 100            # initial values are integers in [-INITIAL, INITIAL]
PULL_DENSE_EVERY = 50    # trainers also read the blocks now and then, racing the pushes


def _ids(rng: np.random.Generator, n: int, exclude: set[int]) -> np.ndarray:
    out: set[int] = set()
    while len(out) < n:
        x = int(rng.integers(0, 2**64 - 1, dtype=np.uint64, endpoint=True))
        if x not in exclude:
            out.add(x)
    return np.array(sorted(out), np.uint64)


def run_exact_sums(cluster, steps: int) -> None:
    c = cluster(servers=SERVERS, trainers=TRAINERS, mode="async", timeout=60.0, min_block_size=MIN_BLOCK_SIZE)
    addresses = list(c.base.servers)
    plan = make_plan(PARAMS, SERVERS, min_block_size=MIN_BLOCK_SIZE)
    assert {b.server for b in plan.blocks} == set(range(SERVERS))
    assert len(plan.blocks_of("w")) == 2 and len(plan.blocks_of("m")) == 2, plan.blocks
    rng = np.random.default_rng(2024)
    initial = {p.name: rng.integers(-INITIAL, INITIAL + 1, p.numel).astype(np.float32) for p in PARAMS}
    shared = _ids(rng, SHARED_IDS, set())
    own = [_ids(rng, OWN_IDS, set(shared.tolist())) for _ in range(TRAINERS)]
    assert len(set(np.concatenate([shared, *own]).tolist())) == SHARED_IDS + TRAINERS * OWN_IDS
    shared_initial = rng.integers(-INITIAL, INITIAL + 1, (SHARED_IDS, DIM)).astype(np.float32)
    spec = TableSpec(TABLE, DIM, ps.optim.SGD(lr=1.0), init_scale=0.0)

    # The chief registers the blocks and the table, and gives the shared rows integer values.
    chief_links = ServerLinks(addresses, timeout=60.0)
    chief_links.wait_ready(30)
    DenseClient(chief_links, plan, 0).register_dense(initial, ps.optim.SGD(lr=1.0))
    chief_sparse = SparseClient(chief_links, 0)
    chief_sparse.register_sparse(spec)
    chief_sparse.import_sparse(TABLE, shared, shared_initial)

    def trainer(t: int):
        links = ServerLinks(addresses, timeout=60.0)
        links.wait_ready(30)
        dense, sparse = DenseClient(links, plan, t), SparseClient(links, t)
        if t != 0:
            sparse.register_sparse(spec)   # what a real non-chief does: the same declaration again
        trng = np.random.default_rng(1000 + t)
        dense_sum = {p.name: np.zeros(p.numel, np.int64) for p in PARAMS}
        row_sum: dict[int, np.ndarray] = {}
        scratch = {p.name: np.empty(p.numel, np.float32) for p in PARAMS}
        for step in range(steps):
            grads = {p.name: trng.integers(-GRAD, GRAD + 1, p.numel) for p in PARAMS}
            for name, g in grads.items():
                dense_sum[name] += g
            dense.push_dense({name: g.astype(np.float32) for name, g in grads.items()}, step)
            if step % PULL_DENSE_EVERY == 0:
                dense.pull_dense(scratch, 0)
            picked = [shared[trng.choice(SHARED_IDS, SHARED_PER_STEP, replace=False)],
                      own[t] if step == 0 else own[t][trng.choice(OWN_IDS, OWN_PER_STEP, replace=False)]]
            ids = np.sort(np.concatenate(picked))
            rows = sparse.pull_sparse(TABLE, ids, DIM)
            assert rows.shape == (len(ids), DIM)
            g = trng.integers(-GRAD, GRAD + 1, (len(ids), DIM))
            for i, row in zip(ids.tolist(), g):
                row_sum[i] = row_sum.get(i, 0) + row
            sparse.push_sparse(TABLE, ids, g.astype(np.float32), step)
        return links, dense_sum, row_sum

    start = time.monotonic()
    results = run_in_threads([lambda t=t: trainer(t) for t in range(TRAINERS)], timeout=600)
    elapsed = time.monotonic() - start
    try:
        # Expected: initial - everything pushed, in int64.
        want_dense = {p.name: initial[p.name].astype(np.int64) - sum(r[1][p.name] for r in results)
                      for p in PARAMS}
        want_rows: dict[int, np.ndarray] = {int(i): v.astype(np.int64) for i, v in zip(shared, shared_initial)}
        for t in range(TRAINERS):
            for i in own[t].tolist():
                want_rows[i] = np.zeros(DIM, np.int64)
        for _, _, row_sum in results:
            for i, s in row_sum.items():
                want_rows[i] = want_rows[i] - s
        assert all(np.abs(v).max() < 2**24 for v in want_dense.values()), "sums too big to be exact in float32"

        reader = ServerLinks(addresses, timeout=60.0)
        try:
            got = {p.name: np.full(p.numel, np.nan, np.float32) for p in PARAMS}
            DenseClient(reader, plan, 0).pull_dense(got, 0)
            for p in PARAMS:
                bad = np.flatnonzero(got[p.name].astype(np.int64) != want_dense[p.name])
                assert got[p.name].dtype == np.float32 and not np.isnan(got[p.name]).any()
                assert not len(bad), (
                    f"dense {p.name}: {len(bad)} of {p.numel} values are not initial - sum(grads); e.g. at "
                    f"{bad[:5].tolist()}: got {got[p.name][bad[:5]].tolist()}, "
                    f"want {want_dense[p.name][bad[:5]].tolist()}")
                np.testing.assert_array_equal(got[p.name], want_dense[p.name].astype(np.float32))
            # Every push carried every block of its server once: each block saw exactly T x steps updates.
            for server in range(SERVERS):
                blocks = plan.for_server(server)
                hdr, _ = reader.request(server, {"op": "pull_dense", "names": [b.name for b in blocks],
                                                 "min_version": 0, "plan_fingerprint": plan.fingerprint()})
                assert hdr["versions"] == [TRAINERS * steps] * len(blocks), (server, hdr["versions"])

            ids, values = SparseClient(reader, 0).export_sparse(TABLE)
            assert sorted(ids.tolist()) == sorted(want_rows), (
                f"rows on the servers: {len(ids)}, expected {len(want_rows)} "
                f"(missing {sorted(set(want_rows) - set(ids.tolist()))[:5]}, "
                f"extra {sorted(set(ids.tolist()) - set(want_rows))[:5]})")
            want = np.stack([want_rows[i] for i in ids.tolist()])
            bad_rows = np.flatnonzero((values.astype(np.int64) != want).any(axis=1))
            assert not len(bad_rows), (
                f"sparse: {len(bad_rows)} of {len(ids)} rows are not initial - sum(grads); e.g. id "
                f"{int(ids[bad_rows[0]])}: got {values[bad_rows[0]].tolist()}, want {want[bad_rows[0]].tolist()}")
            np.testing.assert_array_equal(values, want.astype(np.float32))
        finally:
            reader.close()
    finally:
        for links, _, _ in results:
            links.close()
        chief_links.close()
    print(f"\n{TRAINERS} async trainers x {steps} steps (dense push + sparse pull/push each) on {SERVERS} "
          f"servers: {elapsed:.1f} s")


def test_exact_sums_under_concurrent_async_pushes(cluster):
    run_exact_sums(cluster, FAST_STEPS)


@pytest.mark.fuzz
@pytest.mark.timeout(900)
def test_exact_sums_under_concurrent_async_pushes_full(cluster):
    run_exact_sums(cluster, FULL_STEPS)
