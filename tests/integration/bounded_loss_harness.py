"""Exact sums through a server kill with bounded-loss recovery (shared by the test and
benchmarks/server_recovery.py).

2 servers, 4 async trainers (threads, each with its own links and ServeAgain retry
policy) push integer gradients (SGD lr=1: ``value -= grad``, exact in float32) to dense
blocks on both servers and to sparse rows; a ReplicaKeeper copies both servers every
0.25 s. Mid-run server 1 gets SIGKILL and is started again in place (recovering), the
keeper restores its replica, the trainers resend what failed and go on.

The oracle: every value equals ``initial - sum(every gradient pushed) + sum(the lost
pushes' gradients on server 1)``, where a push of trainer t is lost when the old server
answered it (the trainer had not waited for a replacement yet) and its step is past the
step the restored replica holds for t (the keeper reports the steps it restored). It also
counts the pushes server 1 answered in the last second before the kill (from the
trainers' side) and the time until it serves again: the goals (at most 1 s of pushes lost,
serving within 10 s) are measured by benchmarks/server_recovery.py.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time

import numpy as np

import paramshard as ps
from paramshard.client.dense import DenseClient
from paramshard.client.recovery import ServeAgain
from paramshard.client.sparse import SparseClient, TableSpec
from paramshard.launch.engines.local import child_environ
from paramshard.launch.engines.processes import Child
from paramshard.launch.elastic.replica_keeper import ReplicaKeeper
from paramshard.placement.sharding import ParamSpec, make_plan
from paramshard.placement.sparse_hash import server_of
from paramshard.transport.links import ServerLinks

TRAINERS, SERVERS, VICTIM = 4, 2, 1
MIN_BLOCK_SIZE = 64
PARAMS = [ParamSpec("w", (2000,)), ParamSpec("b", (10,))]
TABLE, DIM, SHARED_IDS, OWN_IDS, PER_STEP = "emb", 4, 64, 16, 16
GRAD, INITIAL = 3, 100


@dataclasses.dataclass
class Outcome:
    serving_again_s: float          # from the kill until server 1 answers in the job's epoch
    restored: dict                  # the keeper's restore record
    lost_pushes: int                # pushes to server 1 the old server answered after its last copy
    answered_last_second: int       # pushes server 1 answered in the second before the kill
    steps: int                      # pushes per trainer


def _restart(cluster, server: int) -> None:
    env = dataclasses.replace(cluster.base, role="server", server_id=server, recovering=True)
    cluster.children[server] = Child(f"server {server}", [sys.executable, "-m", "paramshard", "server"],
                                     child_environ(env))


def _serving(address: str, timeout: float, epoch: int = 0) -> None:
    links = ServerLinks([address], timeout=2.0, who="probe")
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                if links.request(0, {"op": "hello"}, timeout=1.0)[0]["generation"] == epoch:
                    return
            except ps.errors.ParamshardError:
                pass
            time.sleep(0.02)
        raise AssertionError(f"server at {address} did not serve again within {timeout} s")
    finally:
        links.close()


def run(cluster, kill_after: float = 1.5, run_after: float = 1.0, timeout: float = 15.0) -> Outcome:
    c = cluster(servers=SERVERS, trainers=TRAINERS, mode="async", timeout=timeout, min_block_size=MIN_BLOCK_SIZE,
                recovery="bounded-loss")
    addresses = list(c.base.servers)
    plan = make_plan(PARAMS, SERVERS, min_block_size=MIN_BLOCK_SIZE)
    rng = np.random.default_rng(7)
    initial = {p.name: rng.integers(-INITIAL, INITIAL + 1, p.numel).astype(np.float32) for p in PARAMS}
    on_victim = {p.name: np.zeros(p.numel, bool) for p in PARAMS}
    for b in plan.for_server(VICTIM):
        on_victim[b.param][b.offset:b.offset + b.size] = True
    shared = np.unique(rng.integers(1, 2**63, SHARED_IDS, dtype=np.uint64))
    own = [np.unique(rng.integers(1, 2**63, OWN_IDS, dtype=np.uint64)) for _ in range(TRAINERS)]
    shared_initial = rng.integers(-INITIAL, INITIAL + 1, (len(shared), DIM)).astype(np.float32)
    spec = TableSpec(TABLE, DIM, ps.optim.SGD(lr=1.0), init_scale=0.0)

    chief = ServerLinks(addresses, timeout=timeout)
    chief.wait_ready(30)
    DenseClient(chief, plan, 0).register_dense(initial, ps.optim.SGD(lr=1.0))
    SparseClient(chief, 0).register_sparse(spec)
    SparseClient(chief, 0).import_sparse(TABLE, shared, shared_initial)
    keeper = ReplicaKeeper(addresses, timeout).start()
    stop = threading.Event()

    def trainer(t: int):
        links = ServerLinks(addresses, timeout=timeout)
        links.retry = retry = ServeAgain(timeout)
        dense, sparse = DenseClient(links, plan, t), SparseClient(links, t)
        if t:
            sparse.register_sparse(spec)
        trng = np.random.default_rng(100 + t)
        log = []     # per step: (dense grads, sparse ids, sparse grads, answered by the old server 1, times)
        step = 0
        while not stop.is_set():
            grads = {p.name: trng.integers(-GRAD, GRAD + 1, p.numel) for p in PARAMS}
            dense.push_dense({n: g.astype(np.float32) for n, g in grads.items()}, step)
            dense_done, dense_old = time.monotonic(), not retry.waits
            ids = np.unique(np.concatenate([shared[trng.choice(len(shared), PER_STEP, replace=False)],
                                            own[t] if step == 0 else own[t][trng.choice(len(own[t]), 4, replace=False)]]))
            sparse.pull_sparse(TABLE, ids, DIM)
            g = trng.integers(-GRAD, GRAD + 1, (len(ids), DIM))
            sparse.push_sparse(TABLE, ids, g.astype(np.float32), step)
            log.append((grads, ids, g, dense_old, not retry.waits, dense_done, time.monotonic()))
            step += 1
        links.close()
        return log

    results: list = [None] * TRAINERS
    threads = [threading.Thread(target=lambda t=t: results.__setitem__(t, trainer(t)), daemon=True)
               for t in range(TRAINERS)]
    try:
        deadline = time.monotonic() + 30
        while not keeper.latest():
            assert time.monotonic() < deadline, "the keeper made no whole copy"
            time.sleep(0.02)
        for th in threads:
            th.start()
        time.sleep(kill_after)
        os.kill(c.children[VICTIM].pid, signal.SIGKILL)
        killed = time.monotonic()
        c.children[VICTIM].proc.wait(5)
        keeper.note_lost(VICTIM, killed)     # as the launcher does when it sees the server dead
        _restart(c, VICTIM)
        _serving(addresses[VICTIM], timeout)
        serving_again = time.monotonic() - killed
        time.sleep(run_after)
        stop.set()
        for th in threads:
            th.join(timeout * 2)
        assert all(r is not None for r in results), "a trainer thread failed (see its exception above)"
    finally:
        stop.set()
        keeper.stop()
    assert len(keeper.restores) == 1, keeper.restores
    restored = keeper.restores[0]
    steps_of = {stream: dict(map(tuple, pairs)) for stream, pairs in restored["steps"].items()}

    # The oracle, in int64.
    want = {p.name: initial[p.name].astype(np.int64) for p in PARAMS}
    rows = {int(i): v.astype(np.int64) for i, v in zip(shared, shared_initial)}
    for t in range(TRAINERS):
        rows.update({int(i): np.zeros(DIM, np.int64) for i in own[t]})
    lost = answered_last_second = 0
    for t, log in enumerate(results):
        for step, (grads, ids, g, dense_old, sparse_old, dense_done, sparse_done) in enumerate(log):
            dense_lost = dense_old and step > steps_of["dense"].get(t, -1)
            sparse_lost = sparse_old and step > steps_of[f"sparse:{TABLE}"].get(t, -1)
            victim_rows = server_of(ids, SERVERS) == VICTIM
            for name, grad in grads.items():
                want[name] -= grad if not dense_lost else np.where(on_victim[name], 0, grad)
            for i, row, mine in zip(ids.tolist(), g, victim_rows):
                if not (sparse_lost and mine):
                    rows[i] = rows[i] - row
            lost += int(dense_lost) + int(sparse_lost and victim_rows.any())
            answered_last_second += int(dense_old and killed - 1.0 <= dense_done <= killed)
            answered_last_second += int(sparse_old and victim_rows.any() and killed - 1.0 <= sparse_done <= killed)

    reader = ServerLinks(addresses, timeout=timeout)
    try:
        got = {p.name: np.full(p.numel, np.nan, np.float32) for p in PARAMS}
        DenseClient(reader, plan, 0).pull_dense(got, 0)
        for p in PARAMS:
            bad = np.flatnonzero(got[p.name].astype(np.int64) != want[p.name])
            assert not len(bad), (f"dense {p.name}: {len(bad)} values are not initial - sum(grads) + lost; e.g. at "
                                  f"{bad[:5].tolist()} (on server {VICTIM}: {on_victim[p.name][bad[:5]].tolist()}): "
                                  f"got {got[p.name][bad[:5]].tolist()}, want {want[p.name][bad[:5]].tolist()}")
        ids, values = SparseClient(reader, 0).export_sparse(TABLE)
        assert sorted(ids.tolist()) == sorted(rows), "the table's rows are not the ids pushed"
        expect = np.stack([rows[i] for i in ids.tolist()])
        bad = np.flatnonzero((values.astype(np.int64) != expect).any(axis=1))
        assert not len(bad), (f"sparse: {len(bad)} of {len(ids)} rows are not initial - sum(grads) + lost; e.g. id "
                              f"{int(ids[bad[0]])} on server {int(server_of(ids[bad[:1]], SERVERS)[0])}: got "
                              f"{values[bad[0]].tolist()}, want {expect[bad[0]].tolist()}")
    finally:
        reader.close()
        chief.close()
    return Outcome(serving_again, restored, lost, answered_last_second, min(len(r) for r in results))
