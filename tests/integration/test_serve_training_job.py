"""A serving replica follows a real training job's delta directory (server/services/delta_service.py)
while the job trains, and at the end serves exactly what the servers hold: every row of every table
(bit for bit), every dense block, and the version of each server's last file. Oracles: the servers'
own tables and blocks (tests/integration/test_deltas.py held), and online/rebuild.py's model."""
from __future__ import annotations

import threading
import time

import numpy as np
import torch

from paramshard.online.delta_log import DeltaLog
from paramshard.online.rebuild import rebuild
from paramshard.online.replica_status import read_statuses
from paramshard.observe.report.deltas_view import lag, published_seqs
from paramshard.server.services.delta_service import DeltaService
from paramshard.serving.live_table import StoreChoice
from paramshard.serving.replica import Replica
from paramshard.serving.status_writer import StatusWriter
from tests.integration.test_deltas import Net, held, run_job

DEADLINE = 120.0


def test_a_replica_following_a_training_job_serves_what_the_servers_hold(cluster, tmp_path):
    root = tmp_path / "deltas"
    done, followed, replicas = threading.Event(), [], []

    def follow():
        # From the chief's model.pt on: start, then poll while the job trains (deltas, periodic
        # snapshots, pruning: a replica that falls behind a pruned delta starts from a snapshot).
        deadline = time.monotonic() + DEADLINE
        while not (root / "model.pt").is_file() or not DeltaLog(root).servers():
            if done.is_set() or time.monotonic() > deadline:
                return
            time.sleep(0.01)
        time.sleep(0.05)       # both servers' first snapshots
        replica = Replica(root, StoreChoice("compiled"), build=Net).start()
        replicas.append(replica)
        while not done.is_set() and time.monotonic() < deadline:
            followed.append(replica.poll())
            time.sleep(0.02)

    follower = threading.Thread(target=follow)
    follower.start()
    try:
        _, servers, plan = run_job(cluster, tmp_path, mode="sync", trainers=1, steps=16)
    finally:
        done.set()
        follower.join(DEADLINE)
    assert replicas, "the follower never saw model.pt and a server's files"
    replica = replicas[0]
    print(f"files applied by polls while the job trained: {sum(followed)} in {len(followed)} polls")
    replica.poll()                     # what the servers published last
    try:
        assert replica.health()["ok"], replica.health()
        tables, dense = held(servers)
        for name, (ids, rows) in tables.items():
            live = replica.live_tables()[name]
            assert live.num_rows == len(ids), name
            np.testing.assert_array_equal(live.lookup(ids), rows, err_msg=f"table {name}")
        params = replica.buffer.copies[0].params
        for copy in replica.buffer.copies:
            for block, (param, offset, size) in plan.items():
                np.testing.assert_array_equal(copy.params[param].detach().view(-1)[offset:offset + size].numpy(),
                                              dense[block], err_msg=f"block {block}")
        assert params is not None
        model = rebuild(root)
        assert replica.version["servers"] == {str(s): seq for s, seq in model.seqs.items()}
        assert replica.version["step"] == min(model.steps.values())
        # What each server's publisher counted (its stats part) is what the directory and the replica
        # show: a server never restarted published one delta per seq; its status file says no lag.
        for server in servers:
            part = server.service(DeltaService).stats()
            assert part.last_seq == model.seqs[server.context.server_id] == part.deltas, part
        writer = StatusWriter(replica, 0, interval=1.0, host="test")
        assert writer.write()
        [status], _ = read_statuses(root, time.time())
        assert not status.stale and set(lag(status, published_seqs(root)).values()) == {0}
        writer.close()
        # It answers with the module of the served version.
        out, version = replica.forward(torch.arange(6).reshape(2, 3))
        assert out.shape == (2,) and version == replica.version
        # A second replica of the same directory, started after the job (from the servers' latest
        # snapshots and the deltas after them, in another row store), serves the same model.
        late = Replica(root, StoreChoice("numpy"), build=Net).start()
        try:
            late.poll()
            assert late.version["servers"] == replica.version["servers"]
            for name, (ids, rows) in tables.items():
                np.testing.assert_array_equal(late.live_tables()[name].lookup(ids), rows, err_msg=f"late {name}")
            np.testing.assert_array_equal(late.forward(torch.arange(6).reshape(2, 3))[0].detach().numpy(),
                                          out.detach().numpy())
        finally:
            late.close()
    finally:
        replica.close()
