"""The delta publisher's stats part (server/services/delta_service.py -> messages/server_stats.py
DeltaStats) against the oracle of the files it wrote: every file counted once, its bytes the file's
size, its rows and tombstones the file's; the largest delta, the last snapshot; the wire form round
trips and the launcher's server record carries it (observe/live/monitor.py). No sockets: a
ServerContext, a sparse service and a manual clock."""
import numpy as np
import pytest

import paramshard as ps
from paramshard.errors import ProtocolError
from paramshard.messages.server_stats import DeltaStats, ServerStats
from paramshard.mode import Mode
from paramshard.observe.live.monitor import server_record
from paramshard.online.delta_format import read_delta
from paramshard.online.delta_log import DeltaLog
from paramshard.server.services.delta_service import DeltaService
from paramshard.server.services.sparse_service import SparseService
from paramshard.server.storage.dense_store import DenseStore
from paramshard.tables import Admission, Eviction, policy_to_wire
from tests.unit.server_fakes import Clock, context


def publisher(tmp_path, clock):
    ctx = context(Mode.ASYNC, trainers=1, clock=clock)
    sparse = SparseService(Mode.ASYNC, ctx.membership)
    sparse.handle_register_sparse({"table": "t", "trainer": 0, "dim": 3, "seed": 9,
                                   "optimizer": ps.optim.SGD(lr=0.1).to_wire(),
                                   "policy": policy_to_wire(Admission(), Eviction(), 0.1)}, [])
    service = DeltaService(ctx, DenseStore(Mode.ASYNC, ctx.membership), sparse, str(tmp_path), seconds=1.0,
                           snapshot_every=2, clock=clock)
    ctx.services.append(service)
    return sparse, service


def push(sparse, ids, step):
    ids = np.asarray(ids, np.uint64)
    sparse.handle_pull_sparse({"table": "t", "trainer": 0, "min_version": 0}, [ids]).make_reply()
    sparse.handle_push_sparse({"table": "t", "trainer": 0, "step": step, "distinct": True},
                              [ids, np.ones((len(ids), 3), np.float32)])


def test_the_stats_part_counts_what_the_files_hold(tmp_path):
    clock = Clock(100.0)
    sparse, service = publisher(tmp_path, clock)
    assert service.stats() == DeltaStats()               # nothing published yet: no seq, no times
    push(sparse, range(10), 0)
    for step, ids in enumerate(([1, 2, 3], range(20, 45), [5]), start=1):
        clock.now += 1.0
        service.maybe_publish()                          # snapshot 0, then deltas 1, 2, 3 (a snapshot at 2)
        service.flush()
        push(sparse, ids, step)
    clock.now += 1.0
    service.maybe_publish()
    service.flush()
    clock.now += 0.25
    stats = service.stats()

    entries = DeltaLog(tmp_path).entries(0)
    files = {(e.kind, e.seq): (e.path.stat().st_size, read_delta(e.path)) for e in entries}
    deltas = [(size, sum(len(t.ids) for t in d.tables.values()), sum(len(t.tombstones) for t in d.tables.values()))
              for (kind, _), (size, d) in files.items() if kind == "delta"]
    snapshots = [(seq, size, sum(len(t.ids) for t in d.tables.values()))
                 for (kind, seq), (size, d) in files.items() if kind == "snapshot"]
    assert [k for k in files] == [("snapshot", 0), ("delta", 1), ("delta", 2), ("snapshot", 2), ("delta", 3)]
    assert (stats.deltas, stats.snapshots, stats.last_seq) == (3, 2, 3)      # nothing pruned yet (2 snapshots kept)
    assert stats.delta_bytes == sum(s for s, _, _ in deltas)
    assert stats.snapshot_bytes == sum(s for _, s, _ in snapshots)
    assert stats.bytes == stats.delta_bytes + stats.snapshot_bytes
    assert stats.rows == sum(r for _, r, _ in deltas) == 3 + 25 + 1
    assert stats.tombstones == sum(t for _, _, t in deltas)
    assert (stats.max_delta_bytes, stats.max_delta_rows) == (max(s for s, _, _ in deltas), 25)
    assert (stats.last_snapshot_bytes, stats.last_snapshot_rows) == snapshots[-1][1:] == (snapshots[-1][1], 10 + 25)
    assert stats.since_last_s == 0.25 and stats.last_publish_s == 0.0     # the manual clock stood still meanwhile
    assert service.published == {"deltas": 3, "snapshots": 2, "bytes": stats.bytes}

    # The wire: nested under "deltas", round trips, and the launcher's record carries it.
    reply = ServerStats.assemble([stats], server=0, counters={"requests": 1})
    wire = reply.to_wire()
    assert wire["deltas"]["rows"] == 29 and ServerStats.from_wire(wire) == reply
    record = server_record(ServerStats.from_wire(wire), None, 5.0, None)
    assert record["deltas"] == stats.to_wire()["deltas"]


def test_a_server_without_deltas_has_none_and_a_malformed_part_is_refused():
    assert ServerStats.from_wire({"server": 0}).deltas is None
    assert "deltas" not in server_record(ServerStats(server=0), None, 1.0, None)
    with pytest.raises(ProtocolError, match="deltas.rows"):
        ServerStats.from_wire({"server": 0, "deltas": {"rows": "many"}})
    with pytest.raises(ProtocolError, match="deltas.since_last_s"):
        ServerStats.from_wire({"server": 0, "deltas": {"since_last_s": "soon"}})
