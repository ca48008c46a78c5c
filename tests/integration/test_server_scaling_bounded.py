"""A server move while a bounded-staleness push reply waits (issue 29), over real sockets.

Async, --max-staleness 0, 2 trainers, servers in this process's threads (as the CLI builds
them: runtime.build_server). Trainer 0 pushes step 0: applied at once on both servers, its
reply waits for trainer 1's step 0. Meanwhile the job goes from 2 servers to 3, moving dense
blocks (frozen, exported, imported, dropped by their old owners) before trainer 1 pushes. SGD
with lr = 1 and integer gradients, so the oracles are exact:

- trainer 0 starts step 1 with ``initial - g0 - g1`` in every block (bound 0 is lockstep: both
  trainers' step 0 in, nothing else), although some of its blocks left their server;
- the servers end at ``initial - g0 - g1`` (every push applied once: none resent);
- the path ran: trainer 0 asked for some blocks again (``DenseClient.resent``).
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

import paramshard as ps
from paramshard.client.dense import DenseClient
from paramshard.client.sparse import SparseClient, TableSpec
from paramshard.client.step import StepClient
from paramshard.env import ClusterEnv
from paramshard.launch.engines.ports import free_ports
from paramshard.launch.elastic.server_scaling import move_partitions
from paramshard.placement.partitions import Routing
from paramshard.placement.sharding import ParamSpec, make_plan
from paramshard.server.assembly import build_server
from paramshard.transport.links import ServerLinks

TRAINERS, PARTITIONS, TIMEOUT = 2, 256, 10.0
PLAN = make_plan([ParamSpec("w", (96, 4)), ParamSpec("b", (64,))], 2, min_block_size=16)


def _start(addresses: list[str]) -> list:
    servers = []
    for i, known in ((0, 2), (1, 2), (2, 3)):
        env = ClusterEnv(role="server", server_id=i, servers=tuple(addresses[:known]), num_trainers=TRAINERS,
                         mode="async", timeout=TIMEOUT, partitions=PARTITIONS, max_staleness=0)
        servers.append(build_server(env, bind=addresses[i]).start())
    for server in servers:
        server.wait_ready()
    return servers


def _trainer(addresses: list[str], routing: Routing, t: int):
    links = ServerLinks(addresses[:2], timeout=TIMEOUT)
    sparse = SparseClient(links, t, routing)
    dense = DenseClient(links, PLAN, t)
    dense.follow(sparse)
    steps = StepClient(links, dense, sparse, max_in_flight=0)
    steps.bounded = True
    return links, dense, steps


@pytest.mark.timeout(90)
def test_a_waiting_bounded_reply_survives_its_blocks_moving_and_each_push_counts_once():
    addresses = [f"127.0.0.1:{p}" for p in free_ports(3)]
    servers = _start(addresses)
    rng = np.random.default_rng(29)
    initial = {"w": rng.integers(-100, 101, 384).astype(np.float32),
               "b": rng.integers(-100, 101, 64).astype(np.float32)}
    grads = [{n: rng.integers(-3, 4, len(a)).astype(np.float32) for n, a in initial.items()} for _ in range(2)]
    want = {n: initial[n] - grads[0][n] - grads[1][n] for n in initial}
    routing = Routing.initial(PARTITIONS, addresses[:2])
    opened = []
    try:
        chief = ServerLinks(addresses[:2], timeout=TIMEOUT)
        opened.append(chief)
        chief.wait_ready(30)
        DenseClient(chief, PLAN, 0).register_dense(initial, ps.optim.SGD(lr=1.0))
        # A table with a few rows: the move copies partitions too (the job's usual shape).
        table = SparseClient(chief, 0, routing)
        table.register_sparse(TableSpec("emb", 4, ps.optim.SGD(lr=1.0), init_scale=0.0))
        table.import_sparse("emb", np.arange(64, dtype=np.uint64), np.ones((64, 4), np.float32))

        links0, dense0, steps0 = _trainer(addresses, routing, 0)
        opened.append(links0)
        values0 = {n: np.zeros_like(a) for n, a in initial.items()}
        outcome: list = []

        def trainer0():
            try:
                steps0.push(grads[0], [], 0, values0)     # returns once the reply is in
                outcome.append("ok")
            except BaseException as exc:                  # noqa: BLE001 - reported below
                outcome.append(exc)

        thread = threading.Thread(target=trainer0, daemon=True)
        thread.start()
        for server in servers[:2]:
            _wait_for(lambda: len(server.waiting) == 1, "trainer 0's reply to wait on servers 0 and 1")

        mover = ServerLinks(addresses[:2], timeout=TIMEOUT)
        opened.append(mover)
        record = move_partitions(mover, addresses, [0, 1, 2], per_handoff=64, page_rows=256)
        assert record.blocks > 0, "no dense block moved: the test shows nothing"
        assert thread.is_alive() and not outcome, "trainer 0 went on before trainer 1 finished step 0"

        links1, dense1, steps1 = _trainer(addresses, routing, 1)
        opened.append(links1)
        values1 = {n: np.zeros_like(a) for n, a in initial.items()}
        steps1.push(grads[1], [], 0, values1)
        thread.join(2 * TIMEOUT)
        assert outcome == ["ok"], f"trainer 0's push failed: {outcome}"
        assert dense0.resent > 0, "no reply said its blocks moved: the path under test did not run"
        for n in initial:
            np.testing.assert_array_equal(values0[n], want[n], err_msg=f"trainer 0's {n} for step 1")
            np.testing.assert_array_equal(values1[n], want[n], err_msg=f"trainer 1's {n} for step 1")

        reader = ServerLinks(addresses, timeout=TIMEOUT)
        opened.append(reader)
        router = SparseClient(reader, 0, routing)
        router.refresh_routing()
        final = DenseClient(reader, PLAN, 0)
        final.follow(router)
        held = {n: np.zeros_like(a) for n, a in initial.items()}
        final.pull_dense(held, 0)
        for n in initial:
            np.testing.assert_array_equal(held[n], want[n], err_msg=f"{n} on the servers: a push lost or doubled")
    finally:
        for links in opened:
            links.close()
        for server in servers:
            server.close()


def _wait_for(condition, what: str, deadline: float = TIMEOUT) -> None:
    import time
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"waited {deadline:g} s for {what}")
        time.sleep(0.01)
