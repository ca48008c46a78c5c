"""Bounded-loss recovery in a job whose servers change (issue 29 item 4): the replica keeper
follows the job's routing.

2 async servers with 64 virtual partitions, 3 trainers pushing integer gradients (SGD lr=1)
to dense blocks and sparse rows, a ReplicaKeeper as the launcher runs it. A third server joins
(2 -> 3): the keeper copies it from its first hand-off. With the trainers paused (so no push
is lost and the oracle is exact), server 2 is killed and started again in place: the keeper
restores its replica with the partitions and blocks it held, not those the job's first map
would give a third server. Training goes on, then server 1 leaves (3 -> 2): the keeper stops
copying it. Oracle: every value is ``initial - sum(every gradient pushed)``.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import paramshard as ps
from paramshard.client.dense import DenseClient
from paramshard.client.recovery import ServeAgain
from paramshard.client.sparse import SparseClient, TableSpec
from paramshard.env import ClusterEnv
from paramshard.errors import DeadlineExceeded, ServerUnavailable
from paramshard.launch.engines.local import child_environ
from paramshard.launch.engines.ports import free_ports
from paramshard.launch.engines.processes import Child, stop_all
from paramshard.launch.elastic.replica_keeper import ReplicaKeeper
from paramshard.launch.elastic.server_scaling import move_partitions
from paramshard.placement.partitions import Routing
from paramshard.placement.sharding import ParamSpec, make_plan
from paramshard.transport.links import ServerLinks
from tests.integration.bounded_loss_harness import _serving

# Starts, stops or kills server processes of its own: `make test` only, not `make check`.
pytestmark = pytest.mark.processes

TRAINERS, PARTITIONS, TIMEOUT = 3, 64, 15.0
TABLE, DIM, SHARED, GRAD, INITIAL = "emb", 4, 400, 3, 100
PLAN = make_plan([ParamSpec("w", (96, 4)), ParamSpec("b", (64,))], 2, min_block_size=16)


def _server(addresses, index: int, known: int, recovering: bool = False) -> Child:
    env = ClusterEnv(role="server", server_id=index, servers=tuple(addresses[:known]), num_trainers=TRAINERS,
                     mode="async", timeout=TIMEOUT, partitions=PARTITIONS, recovery="bounded-loss",
                     recovering=recovering)
    return Child(f"server {index}", [sys.executable, "-m", "paramshard", "server"], child_environ(env))


def _rows_of_a_retired_server(child: Child, addresses) -> int:
    """The rows a server removed by a scale still holds: 0 once it exited by itself (cleanly).
    Its exit is waited for first: asked while it exits, a request can find it gone before the
    connection is made (a deadline, not a refusal), which says nothing about what it held."""
    try:
        return _exited_cleanly(child, within=TIMEOUT)
    except subprocess.TimeoutExpired:
        pass                           # still up after the trainers let go: it must hold nothing
    try:
        with ServerLinks([addresses[1]], timeout=TIMEOUT) as links:
            return len(links.request(0, {"op": "export_sparse", "table": TABLE})[1][0])
    except (ServerUnavailable, DeadlineExceeded):
        if child.proc.poll() is None:
            raise                      # alive and not answering: a real failure
        return _exited_cleanly(child, within=0)


def _exited_cleanly(child: Child, within: float) -> int:
    assert child.proc.wait(within) == 0, f"server 1 exited with code {child.proc.returncode}"
    return 0


def _fresh_copy(keeper: ReplicaKeeper, server: int, after: float, timeout: float = 20.0) -> None:
    """Until the keeper holds a copy of ``server`` it *asked for* after ``after``. A copy that merely
    completed after it may have been asked for before (a round asks every server at once, then
    reads their replies in turn: under load server 2's reply, read last, completed after the
    trainers paused but held what it had before, and the restore lost 54 updates). The round after
    one that completed past ``after`` asks anew: wait for two completions."""
    deadline = time.monotonic() + timeout
    for _ in range(2):
        while not (keeper.copied_at[server] or 0) > after:
            assert time.monotonic() < deadline, f"the keeper made no copy of server {server} in {timeout} s"
            time.sleep(0.02)
        after = keeper.copied_at[server]


@pytest.mark.timeout(150)
def test_the_keeper_follows_a_scale_and_restores_the_partitions_a_server_holds_now():
    addresses = [f"127.0.0.1:{p}" for p in free_ports(3)]
    children = [_server(addresses, 0, 2), _server(addresses, 1, 2), _server(addresses, 2, 3)]
    rng = np.random.default_rng(31)
    shared = np.unique(rng.integers(1, 2**63, SHARED, dtype=np.uint64))
    shared_initial = rng.integers(-INITIAL, INITIAL + 1, (len(shared), DIM)).astype(np.float32)
    dense_initial = {"w": rng.integers(-INITIAL, INITIAL + 1, 384).astype(np.float32),
                     "b": rng.integers(-INITIAL, INITIAL + 1, 64).astype(np.float32)}
    routing = Routing.initial(PARTITIONS, addresses[:2])
    go, stop = threading.Event(), threading.Event()
    go.set()
    idle = [threading.Event() for _ in range(TRAINERS)]
    keeper = None
    try:
        chief = ServerLinks(addresses[:2], timeout=TIMEOUT)
        chief.wait_ready(30)
        sparse0 = SparseClient(chief, 0, routing)
        sparse0.register_sparse(TableSpec(TABLE, DIM, ps.optim.SGD(lr=1.0), init_scale=0.0))
        sparse0.import_sparse(TABLE, shared, shared_initial)
        DenseClient(chief, PLAN, 0).register_dense(dense_initial, ps.optim.SGD(lr=1.0))
        keeper = ReplicaKeeper(addresses[:2], TIMEOUT, partitions=PARTITIONS).start()

        def trainer(t: int):
            links = ServerLinks(addresses[:2], timeout=TIMEOUT)
            links.retry = ServeAgain(TIMEOUT)
            sparse, dense = SparseClient(links, t, routing), DenseClient(links, PLAN, t)
            dense.follow(sparse)
            trng = np.random.default_rng(200 + t)
            sums = np.zeros((len(shared), DIM), np.int64)
            dense_sums = {n: np.zeros(len(a), np.int64) for n, a in dense_initial.items()}
            step = 0
            while not stop.is_set():
                if not go.is_set():          # paused between two steps: nothing in flight
                    idle[t].set()
                    go.wait(60)
                    idle[t].clear()
                    continue
                at = np.sort(trng.choice(len(shared), 32, replace=False))
                sparse.pull_sparse(TABLE, shared[at], DIM)
                g = trng.integers(-GRAD, GRAD + 1, (len(at), DIM))
                sums[at] += g
                sparse.push_sparse(TABLE, shared[at], g.astype(np.float32), step)
                grads = {n: trng.integers(-GRAD, GRAD + 1, len(a)) for n, a in dense_initial.items()}
                for n, d in grads.items():
                    dense_sums[n] += d
                dense.push_dense({n: d.astype(np.float32) for n, d in grads.items()}, step)
                step += 1
            links.close()
            return sums, dense_sums, step

        results: list = [None] * TRAINERS
        threads = [threading.Thread(target=lambda t=t: results.__setitem__(t, trainer(t)), daemon=True)
                   for t in range(TRAINERS)]
        for th in threads:
            th.start()
        time.sleep(0.5)
        with ServerLinks(addresses[:2], timeout=TIMEOUT) as links:
            up = move_partitions(links, addresses, [0, 1, 2], per_handoff=8, page_rows=100)
        assert up.partitions == PARTITIONS // 3 and up.blocks > 0, up
        deadline = time.monotonic() + 10
        while len(keeper.replicas) < 3:       # it reads the routing every round
            assert time.monotonic() < deadline, "the keeper did not take the server the scale added"
            time.sleep(0.02)
        # Paused, and copied since: the kill loses nothing, so the sums are exact.
        go.clear()
        for e in idle:
            assert e.wait(30), "a trainer did not pause"
        _fresh_copy(keeper, 2, time.monotonic())
        held = keeper.replicas[2]
        assert held.blocks and len(held.tables[TABLE].row_parts()["ids"]) > 0, "the copy of server 2 is empty"
        os.kill(children[2].pid, signal.SIGKILL)
        killed = time.monotonic()
        children[2].proc.wait(5)
        keeper.note_lost(2, killed)         # as the launcher does when it sees the server dead
        children[2] = _server(addresses, 2, 3, recovering=True)
        _serving(addresses[2], 30)
        assert len(keeper.restores) == 1, keeper.restores
        go.set()
        time.sleep(1.0)
        with ServerLinks(addresses, timeout=TIMEOUT) as links:
            down = move_partitions(links, addresses, [0, 2], per_handoff=8, page_rows=100)
        assert down.partitions > 0, down
        deadline = time.monotonic() + 10
        while 1 not in keeper.retired:
            assert time.monotonic() < deadline, "the keeper still copies server 1 after it left"
            time.sleep(0.02)
        assert keeper.followed == [0, 2] and keeper.latest() is not None
        time.sleep(0.5)
        stop.set()
        for th in threads:
            th.join(TIMEOUT * 2)
        assert all(r is not None for r in results), "a trainer thread failed (see its exception above)"

        # Server 1 left the routing: once the trainers let go of it, it exits by itself (code 0).
        # Until then it must hold nothing.
        left_rows = _rows_of_a_retired_server(children[1], addresses)
        assert left_rows == 0, f"server 1 still holds {left_rows} rows after it left"
        with ServerLinks(addresses, timeout=TIMEOUT) as reader:
            per_server = {s: reader.request(s, {"op": "export_sparse", "table": TABLE})[1] for s in (0, 2)}
            router = SparseClient(reader, 0, routing)
            router.refresh_routing()
            final = DenseClient(reader, PLAN, 0)
            final.follow(router)
            got_dense = {n: np.zeros_like(a) for n, a in dense_initial.items()}
            final.pull_dense(got_dense, 0)
        for n, initial in dense_initial.items():
            want = initial.astype(np.int64) - sum(r[1][n] for r in results)
            bad = np.flatnonzero(got_dense[n].astype(np.int64) != want)
            assert not len(bad), f"dense {n}: {len(bad)} values are not initial - sum(grads)"
        ids = np.concatenate([per_server[0][0], per_server[2][0]])
        values = np.concatenate([per_server[0][1], per_server[2][1]]).astype(np.int64)
        assert len(np.unique(ids)) == len(ids), "a row is held by two servers"
        order = np.argsort(ids)
        assert np.array_equal(ids[order], np.sort(shared)), "rows lost or made"
        want = (shared_initial.astype(np.int64) - sum(r[0] for r in results))[np.argsort(shared)]
        bad = np.flatnonzero((values[order] != want).any(axis=1))
        assert not len(bad), f"{len(bad)} rows are not initial - sum(grads) (lost or doubled updates)"
        chief.close()
    finally:
        stop.set()
        go.set()
        if keeper is not None:
            keeper.stop()
        stop_all(children, grace=3)
