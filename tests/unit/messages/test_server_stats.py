"""messages/server_stats.py: the ``stats`` reply's one schema (producer and parsers)."""
import json

import pytest

from paramshard.errors import ProtocolError
from paramshard.observe.report.server_table import server_load_table
from paramshard.messages.server_stats import (BarrierStats, BarrierWait, Connections, DenseStats, ServerStats,
                                               SparseStats, TableStats, TrainerStates)

# A reply as an async server with a sparse table sends it (the layout of `paramshard stats --json`).
WIRE = {"server": 1, "address": "127.0.0.1:6001", "uptime_s": 12.5, "started_at": 1795983681.375,
        "trainers": {"live": [0, 2], "left": [1], "lost": []},
        "phase_seconds": {"decode": 0.25, "push_dense": 1.5, "reply": 0},
        "requests": 40, "bytes_in": 1000, "bytes_out": 2000, "errors": 1, "timeouts": 0,
        "op_push_dense": 10, "op_pull_dense": 12, "deferred_answered": 3, "deferred_wait_s": 0.75,
        "connections_tracked": 2, "queued_reply_bytes": 0, "held_requests": 0,
        "dense_blocks": 2, "dense_elements": 500, "staleness": {"0": 7, "2": 1},
        "barriers": {"names": 1, "waiting": {"epoch": {"count": 3, "missing": [2]}}},
        "sparse_rows": 9, "sparse_bytes": 288,
        "tables": {"emb": {"rows": 9, "bytes": 288, "version": 4, "evicted": 0, "dim": 8, "rows_updated": 30,
                           "phase_seconds": {"gather": 0.01}}}}


def test_the_wire_form_round_trips_exactly_including_the_order_of_keys():
    stats = ServerStats.from_wire(WIRE)
    assert stats.to_wire() == WIRE
    assert json.dumps(stats.to_wire()) == json.dumps(WIRE)


def test_the_parsed_reply_answers_in_types():
    s = ServerStats.from_wire(WIRE)
    assert (s.server, s.requests, s.dense_elements, s.sparse_rows) == (1, 40, 500, 9)
    assert s.trainers == TrainerStates(live=(0, 2), left=(1,), lost=())
    assert s.staleness == {0: 7, 2: 1}
    assert s.ops == {"push_dense": 10, "pull_dense": 12}
    assert s.counter("requests_held") == 0                  # not counted yet: 0
    assert s.tables["emb"].dim == 8
    assert s.barriers.waiting["epoch"] == BarrierWait(3, (2,))


def test_what_a_server_does_not_have_is_absent_on_the_wire_and_zero_when_read():
    wire = {"server": 0, "address": "in-process:0", "uptime_s": 1.0,
            "trainers": {"live": [0], "left": [], "lost": []}, "phase_seconds": {},
            "requests": 0, "bytes_in": 0, "bytes_out": 0, "errors": 0, "timeouts": 0,
            "dense_blocks": 0, "dense_elements": 0}        # sync (no staleness), no sparse service
    s = ServerStats.from_wire(wire)
    assert s.sparse is None and s.tables == {} and s.sparse_rows == 0
    assert s.dense.staleness is None and s.staleness == {}
    assert s.to_wire() == wire


def test_only_the_server_id_is_required():
    s = ServerStats.from_wire({"server": 3})
    assert (s.server, s.address, s.requests, s.dense, s.sparse, s.barriers) == (3, None, 0, None, None, None)
    assert s.to_wire()["server"] == 3


def test_the_producer_assembles_the_services_parts_in_wire_order():
    parts = [Connections(1, 2, 3), DenseStats(2, 500, {0: 7, 2: 1}), None,
             BarrierStats(1, {"epoch": BarrierWait(3, (2,))}),
             SparseStats(9, 288, {"emb": TableStats(9, 288, 4, 0, 8, 30, {"gather": 0.01})}), None]
    s = ServerStats.assemble(parts, server=1, address="a:1", uptime_s=2.0, trainers=TrainerStates((0,)),
                             phase_seconds={}, counters={"requests": 5})
    assert list(s.to_wire()) == ["server", "address", "uptime_s", "trainers", "phase_seconds", "requests",
                                 "connections_tracked", "queued_reply_bytes", "held_requests", "dense_blocks",
                                 "dense_elements", "staleness", "barriers", "sparse_rows", "sparse_bytes", "tables"]
    assert ServerStats.from_wire(s.to_wire()) == s
    with pytest.raises(ValueError, match="two services report dense"):
        ServerStats.assemble([DenseStats(), DenseStats()], server=0)
    with pytest.raises(TypeError, match="stats\\(\\) gave dict"):
        ServerStats.assemble([{"dense_blocks": 1}], server=0)


@pytest.mark.parametrize("change, field", [
    ({"server": "1"}, "server"),
    ({"server": True}, "server"),
    ({"requests": "many"}, "requests"),
    ({"trainers": {"live": [0, "x"]}}, r"trainers.live\[1\]"),
    ({"trainers": []}, "trainers"),
    ({"phase_seconds": {"decode": None}}, "phase_seconds"),
    ({"staleness": {"zero": 1}}, "staleness key"),
    ({"staleness": {"0": 1.5}}, "staleness"),
    ({"tables": {"emb": {"rows": -0.5}}}, r"tables\['emb'\].rows"),
    ({"tables": {"emb": []}}, r"tables\['emb'\]"),
    ({"barriers": {"waiting": {"e": {"missing": [1]}}}}, r"barriers.waiting\['e'\].count"),
    ({"address": 6001}, "address"),
])
def test_a_malformed_reply_is_refused_naming_the_field(change, field):
    with pytest.raises(ProtocolError, match=field):
        ServerStats.from_wire({**WIRE, **change})


def test_a_reply_that_is_no_map_or_has_no_server_is_refused():
    with pytest.raises(ProtocolError, match="the reply"):
        ServerStats.from_wire([1, 2])
    with pytest.raises(ProtocolError, match="no 'server'"):
        ServerStats.from_wire({"requests": 1})


def test_unknown_keys_from_a_newer_server_are_kept_if_counters_and_dropped_otherwise():
    s = ServerStats.from_wire({**WIRE, "op_new_op": 2, "some_map": {"a": 1}, "flag": True})
    assert s.ops["new_op"] == 2
    assert "some_map" not in s.to_wire() and "flag" not in s.to_wire()


def test_the_load_table_reads_the_wire_form_and_the_typed_form_alike():
    assert server_load_table([WIRE]) == server_load_table([ServerStats.from_wire(WIRE)])


def test_a_services_part_reads_as_its_wire_fragment_too():
    assert BarrierStats(0, {})["barriers"] == {"names": 0, "waiting": {}}
    assert DenseStats(1, 2)["dense_elements"] == 2
