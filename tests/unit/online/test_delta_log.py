"""The delta directory: atomic publication, order, and pruning that keeps every file a replica needs."""
import numpy as np

from paramshard.online.delta_format import Delta, TableChange, read_delta
from paramshard.online.delta_log import DeltaLog


def delta(server, seq, kind="delta"):
    change = TableChange(np.array([seq], np.uint64), np.full((1, 2), seq, np.float32),
                         np.array([], np.uint64), version=seq)
    return Delta(kind, server, seq, step=seq * 10, created=0.0, tables={"t": change}, dense={})


def test_published_files_list_in_seq_order_per_server(tmp_path):
    log = DeltaLog(tmp_path)
    for seq in (0, 2, 1, 3):
        log.publish(delta(1, seq, "snapshot" if seq == 0 else "delta"))
    log.publish(delta(0, 0, "snapshot"))
    log.publish(delta(1, 3, "snapshot"))
    assert log.servers() == [0, 1]
    assert [(e.seq, e.kind) for e in log.entries(1)] == [(0, "snapshot"), (1, "delta"), (2, "delta"),
                                                         (3, "delta"), (3, "snapshot")]
    assert log.latest_snapshot(1).seq == 3
    assert [e.seq for e in log.deltas_after(1, 1)] == [2, 3]
    assert read_delta(log.entries(1)[2].path).tables["t"].ids.tolist() == [2]
    assert not [p for p in log.server_dir(1).iterdir() if p.name.startswith(".")]   # no temporary left


def test_a_temporary_file_is_never_listed(tmp_path):
    log = DeltaLog(tmp_path)
    log.publish(delta(0, 1))
    (log.server_dir(0) / ".delta-0000000002.psd.abcd.tmp").write_bytes(b"half")
    assert [e.seq for e in log.entries(0)] == [1]


def test_pruning_keeps_what_a_replica_starting_from_the_older_kept_snapshot_needs(tmp_path):
    log = DeltaLog(tmp_path)
    log.publish(delta(0, 0, "snapshot"))
    for seq in range(1, 7):
        log.publish(delta(0, seq))
        if seq % 3 == 0:
            log.publish(delta(0, seq, "snapshot"))
    assert log.prune(0, keep_snapshots=2) == 4          # snapshot 0, deltas 1-3
    left = [(e.seq, e.kind) for e in log.entries(0)]
    assert left == [(3, "snapshot"), (4, "delta"), (5, "delta"), (6, "delta"), (6, "snapshot")]
    assert log.prune(0, keep_snapshots=3) == 0
