"""Issue 29 leftover: a server a scale removed retires quietly. Two real servers, two trainers'
links (one of them the chief); the job scales to server 0 alone (server 1 retires: its routing
names it "", then ``retire`` with ``exit``). Before, server 1 logged "lost its connection without
leaving" for each trainer as it went (the trainers closing their links to a server the routing
removed). Oracle: server 1 exits 0 and logs no loss; a real loss (a trainer's links closed without
``leave``) is still warned about, by server 0."""
from __future__ import annotations

import io
import sys
import time

import numpy as np
import pytest

import paramshard as ps
from paramshard.client.sparse import SparseClient, TableSpec
from paramshard.env import ClusterEnv
from paramshard.launch.elastic.elastic_servers import stop_when_unneeded
from paramshard.launch.engines.local import child_environ
from paramshard.launch.engines.ports import free_ports
from paramshard.launch.engines.processes import Child, stop_all
from paramshard.launch.elastic.server_scaling import scale_servers
from paramshard.placement.partitions import Routing
from paramshard.transport.links import ServerLinks

# Starts, stops or kills server processes of its own: `make test` only, not `make check`.
pytestmark = pytest.mark.processes

TRAINERS, PARTITIONS, TIMEOUT, LOSS = 2, 64, 20.0, "lost its connection without leaving"


def _wait_for(predicate, what: str, seconds: float = 15.0) -> None:
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.timeout(90)
def test_a_retired_server_logs_no_loss_and_a_real_loss_still_warns():
    addresses = [f"127.0.0.1:{p}" for p in free_ports(2)]
    outs = [io.StringIO(), io.StringIO()]
    env = ClusterEnv(role=None, servers=tuple(addresses), num_trainers=TRAINERS, mode="async", timeout=TIMEOUT,
                     partitions=PARTITIONS, min_trainers=1)
    children = [Child(f"server {i}", [sys.executable, "-m", "paramshard", "server"],
                      child_environ(ClusterEnv(**{**env.__dict__, "role": "server", "server_id": i})),
                      outs[i]) for i in range(2)]
    links = []
    try:
        ids = np.arange(200, dtype=np.uint64)
        clients = []
        for t in range(TRAINERS):
            link = ServerLinks(addresses, timeout=TIMEOUT)
            link.wait_ready(30)
            links.append(link)
            clients.append(SparseClient(link, t, Routing.initial(PARTITIONS, addresses)))
        clients[0].register_sparse(TableSpec("emb", 4, ps.optim.SGD(lr=1.0)))
        for t, client in enumerate(clients):            # both servers hear from both trainers
            client.pull_sparse("emb", ids, 4)
            client.push_sparse("emb", ids, np.ones((len(ids), 4), np.float32), 0)
        record = scale_servers(env, addresses, [0])
        for client in clients:
            client.refresh_routing()                    # the routing naming server 1 retired: links close
            client.pull_sparse("emb", ids, 4)
        assert all(link.is_retired(1) for link in links)
        assert stop_when_unneeded(env, addresses, [1], record.routing_version - 1, patience=10.0)
        assert children[1].proc.wait(timeout=15) == 0, outs[1].getvalue()
        assert LOSS not in outs[1].getvalue(), outs[1].getvalue()
        # A real loss: trainer 1's links close without a leave. Server 0 still says so.
        links.pop().close()
        _wait_for(lambda: LOSS in outs[0].getvalue(), "server 0 to warn of trainer 1's loss")
        assert "trainer 1 " + LOSS in outs[0].getvalue()
    finally:
        for link in links:
            link.close()
        stop_all(children, grace=3)
