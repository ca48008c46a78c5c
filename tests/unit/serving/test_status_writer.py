"""serving/status_writer.py: a replica's status file in its delta directory (online/replica_status.py):
written whole with the version it serves and its freshness, rewritten after it applied a delta, read
back as stale once not rewritten for more than 3 x its interval, removed when it stops cleanly, and
shown so by `paramshard report DELTA_DIR` (observe/report/deltas_view.py). An in-process replica on a
directory built here; a manual clock (no sleeping)."""
import json

from paramshard.online.replica_status import read_statuses, status_path
from paramshard.observe.report.deltas_view import delta_dir_lines
from paramshard.serving.live_table import StoreChoice
from paramshard.serving.replica import Replica
from paramshard.serving.status_writer import StatusWriter
from tests.unit.server_fakes import Clock
from tests.unit.serving.delta_dir import change, make_model_dir, publish

T0 = 1_790_000_000.0


def test_the_status_file_follows_the_replica_and_goes_stale_then_away(tmp_path):
    make_model_dir(tmp_path)
    publish(tmp_path, "snapshot", 0, 0, 0, change([1, 2, 3], 0.5), created=T0 - 10)
    publish(tmp_path, "snapshot", 1, 0, 0, change([4], 0.5), created=T0 - 10)
    publish(tmp_path, "delta", 0, 1, 5, change([1, 7], 1.0, tombstones=[3]), created=T0 - 4)
    replica = Replica(tmp_path, StoreChoice("numpy")).start()
    clock = Clock(T0)
    writer = StatusWriter(replica, 8500, "http://127.0.0.1:8500", interval=2.0, host="hostA", clock=clock)
    try:
        assert writer.write()
        path = status_path(tmp_path, "hostA", 8500)
        assert path == tmp_path / "replicas" / "hostA-8500.json" and writer.path == path
        assert [p.name for p in path.parent.iterdir()] == [path.name]        # no temporary left behind
        data = json.loads(path.read_text())
        assert data["version"]["servers"] == {"0": 1, "1": 0} and data["step"] == replica.version["step"]
        assert data["freshness_s"] == 4.0 and data["newest_created"] == T0 - 4
        assert (data["files_applied"], data["rows_applied"], data["ok"], data["last_error"]) == (3, 6, True, None)
        assert (data["started"], data["updated"], data["interval_s"], data["port"]) == (T0, T0, 2.0, 8500)

        # Server 1 publishes a delta; the replica applies it; the next write says so.
        publish(tmp_path, "delta", 1, 1, 6, change([4, 9], 2.0), created=T0 + 1)
        clock.now = T0 + 3
        statuses, problems = read_statuses(tmp_path, clock.now)
        lines = delta_dir_lines(tmp_path, now=clock.now)
        assert "server 0 0 behind, server 1 1 behind" in "\n".join(lines), lines
        assert replica.poll() == 1
        assert writer.write()
        data = json.loads(path.read_text())
        assert data["version"]["servers"] == {"0": 1, "1": 1} and data["freshness_s"] == 2.0
        assert data["updated"] == T0 + 3 and data["started"] == T0

        # Read back: fresh up to 3 intervals after its last write, stale past them.
        [status], problems = read_statuses(tmp_path, T0 + 3 + 6.0)
        assert not problems and not status.stale and status.applied == {0: 1, 1: 1}
        [status], _ = read_statuses(tmp_path, T0 + 3 + 6.5)
        assert status.stale and status.age_s == 6.5
        lines = "\n".join(delta_dir_lines(tmp_path, now=T0 + 3 + 6.5))
        assert "replica hostA-8500 (http://127.0.0.1:8500): GONE or hung" in lines, lines
        assert "server 0 0 behind, server 1 0 behind" in lines and "freshness" not in lines
        fresh = "\n".join(delta_dir_lines(tmp_path, now=T0 + 4))
        assert "replica hostA-8500 (http://127.0.0.1:8500): ok; freshness 2.0 s" in fresh, fresh
        # The figures from the files alone: server 0 published snapshot 0 and delta 1 (2 rows, 1 tombstone).
        assert "server 0: 1 deltas" in fresh and "1 snapshots, the last" in fresh and "/ 3 rows" in fresh
    finally:
        writer.close()
        replica.close()
    assert not path.exists()                      # a clean stop: no replica shown as gone
    assert read_statuses(tmp_path, T0) == ([], [])
    assert "none running" in "\n".join(delta_dir_lines(tmp_path, now=T0))


def test_a_damaged_status_file_is_named_and_a_read_only_directory_costs_only_the_status(tmp_path):
    (tmp_path / "replicas").mkdir()
    (tmp_path / "replicas" / "x-1.json").write_text("{not json")
    (tmp_path / "replicas" / "y-2.json").write_text(json.dumps({"format": "paramshard-replica-status"}))
    statuses, problems = read_statuses(tmp_path, T0)
    assert statuses == [] and len(problems) == 2
    assert "x-1.json: not a replica status" in problems[0] and "without 'updated'" in problems[1]

    class Stub:                                   # what StatusWriter reads of a replica
        root = tmp_path / "file"
        version = {"servers": {}, "step": 0, "number": 0}
        newest_created, files_applied, rows_applied, errors, last_error = None, 0, 0, {}, None
        buffer = type("B", (), {"broken": None})()
    (tmp_path / "file").write_text("a file where the delta directory should be")
    writer = StatusWriter(Stub(), 1, interval=1.0, host="h")
    assert not writer.write() and "cannot write the replica's status file" in writer.failed
