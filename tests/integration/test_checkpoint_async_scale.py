"""Async checkpoints taken while servers go 2 -> 3 -> 2 are each one consistent cut (issue 29 item 4).

Three async trainers push integer gradients (SGD lr=1: exact in float32) to dense blocks and a
sparse table while a third server takes its share of the partitions and blocks and server 1
then gives all of its own away; the chief checkpoints every few steps all along. Each
checkpoint must hold, for every value, ``initial - the gradients of every trainer's steps up to
the cut its manifest records``: a row read twice (an old owner's copy next to the new one's), a
row missed in a hand-off, or a push one server applied past the cut and another did not,
breaks the equality. The checkpoints taken while a server that joined mid-job held rows wait
there only for the trainers already routing to it (server/services/checkpoint_service.py ``since``).
"""
from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

import paramshard as ps
from paramshard.checkpoint.format import Checkpoint
from paramshard.client.checkpoint import save_checkpoint
from paramshard.client.dense import DenseClient
from paramshard.client.sparse import SparseClient, TableSpec
from paramshard.env import ClusterEnv
from paramshard.launch.engines.local import child_environ
from paramshard.launch.engines.ports import free_ports
from paramshard.launch.engines.processes import Child, stop_all
from paramshard.launch.elastic.server_scaling import move_partitions
from paramshard.placement.partitions import Routing
from paramshard.placement.sharding import ParamSpec, make_plan
from paramshard.transport.links import ServerLinks
from tests.conftest import run_in_threads

# Starts, stops or kills server processes of its own: `make test` only, not `make check`.
pytestmark = pytest.mark.processes

TRAINERS, PARTITIONS, TIMEOUT, SAVE_EVERY, MIN_STEPS = 3, 64, 20.0, 2, 30
TABLE, DIM, VOCAB = "emb", 4, 3000
PLAN = make_plan([ParamSpec("w", (96, 4)), ParamSpec("b", (64,))], 2, min_block_size=16)
SPEC = TableSpec(TABLE, DIM, ps.optim.SGD(lr=1.0), init_scale=0.0)


def pushes(trainer: int, step: int):
    g = np.random.default_rng([trainer, step])
    ids = np.unique(g.integers(0, VOCAB, 48)).astype(np.uint64)
    return ids, g.integers(-3, 4, (len(ids), DIM)), {"w": g.integers(-3, 4, 384), "b": g.integers(-3, 4, 64)}


@pytest.mark.timeout(150)
def test_async_checkpoints_during_2_3_2_are_each_one_cut(tmp_path):
    addresses = [f"127.0.0.1:{p}" for p in free_ports(3)]
    children = []
    for i, known in ((0, 2), (1, 2), (2, 3)):
        env = ClusterEnv(role="server", server_id=i, servers=tuple(addresses[:known]), num_trainers=TRAINERS,
                         mode="async", timeout=TIMEOUT, partitions=PARTITIONS)
        children.append(Child(f"server {i}", [sys.executable, "-m", "paramshard", "server"],
                              child_environ(env)))
    routing = Routing.initial(PARTITIONS, addresses[:2])
    started, done, records, saved = threading.Event(), threading.Event(), [], []
    try:
        chief = ServerLinks(addresses[:2], timeout=TIMEOUT)
        chief.wait_ready(30)
        SparseClient(chief, 0, routing).register_sparse(SPEC)
        DenseClient(chief, PLAN, 0).register_dense({"w": np.zeros(384, np.float32), "b": np.zeros(64, np.float32)},
                                                   ps.optim.SGD(lr=1.0))

        def trainer(t: int):
            links = ServerLinks(addresses[:2], timeout=TIMEOUT)
            sparse, dense = SparseClient(links, t, routing), DenseClient(links, PLAN, t)
            dense.follow(sparse)
            step = 0
            while step < MIN_STEPS or not done.is_set():
                ids, g, d = pushes(t, step)
                sparse.pull_sparse(TABLE, ids, DIM)
                sparse.push_sparse(TABLE, ids, g.astype(np.float32), step)
                dense.push_dense({n: v.astype(np.float32) for n, v in d.items()}, step)
                step += 1
                if step == 5:
                    started.set()
                if t == 0 and step % SAVE_EVERY == 0:
                    sparse.refresh_routing()            # as the backend does before a save
                    path, _, _ = save_checkpoint(links, PLAN, {TABLE: SPEC}, tmp_path, step,
                                                 {"mode": "async", "trainers": TRAINERS})
                    saved.append((path, sparse.routing.version))      # the routing it was taken under
            links.close()
            return step

        def scaler():
            try:
                if not started.wait(TIMEOUT):
                    raise AssertionError("the trainers never started")
                with ServerLinks(addresses[:2], timeout=TIMEOUT) as links:
                    records.append(move_partitions(links, addresses, [0, 1, 2], per_handoff=4, page_rows=300))
                    # A checkpoint or two under the 3-server routing before the next move.
                    after = len(saved)
                    deadline = time.monotonic() + TIMEOUT
                    while len(saved) < after + 2:
                        assert time.monotonic() < deadline, "the chief saved nothing after the first move"
                        time.sleep(0.01)
                    records.append(move_partitions(links, addresses, [0, 2], per_handoff=4, page_rows=300))
            finally:
                done.set()

        run_in_threads([lambda t=t: trainer(t) for t in range(TRAINERS)] + [scaler], timeout=120)
        chief.close()
        assert len(records) == 2 and records[0].partitions and records[1].partitions, records
        under = [len(Routing.from_wire(Checkpoint(p).manifest["routing"]).servers()) for p, _ in saved]
        assert 3 in under, f"no checkpoint under the 3-server routing (servers of each: {under})"
        for path, _ in saved:
            ckpt = Checkpoint(path)
            cut = {int(t): k for t, k in ckpt.manifest["cut"].items()}
            rows: dict[int, np.ndarray] = {}
            dense = {"w": np.zeros(384, np.int64), "b": np.zeros(64, np.int64)}
            for t, last in cut.items():
                for k in range(last + 1):
                    ids, g, d = pushes(t, k)
                    for i, row in zip(ids.tolist(), g):
                        rows[i] = rows.get(i, 0) - row
                    for n in dense:
                        dense[n] -= d[n]
            (table,) = ckpt.manifest["sparse"]
            got_ids = ckpt.array(table["files"]["ids"])
            got = ckpt.array(table["files"]["values"]).astype(np.int64)
            assert len(np.unique(got_ids)) == len(got_ids), f"{path.name}: a row is in it twice"
            held = dict(zip(got_ids.tolist(), got))
            missing = [i for i in rows if i not in held]
            assert not missing, f"{path.name} (cut {cut}): rows pushed up to the cut are missing, e.g. {missing[:3]}"
            bad = [i for i, v in held.items() if not np.array_equal(v, rows.get(i, np.zeros(DIM, np.int64)))]
            assert not bad, f"{path.name} (cut {cut}): {len(bad)} rows are not the sum up to the cut"
            for entry in ckpt.manifest["dense"]:
                np.testing.assert_array_equal(ckpt.array(entry["files"]["values"]).astype(np.int64),
                                              dense[entry["name"]], err_msg=f"{path.name}: {entry['name']}")
    finally:
        stop_all(children, grace=3)
