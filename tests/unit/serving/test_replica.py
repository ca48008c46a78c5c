"""serving/replica.py: a replica's rows and dense parameters equal the reference (the tables the
deltas were made from) after snapshot + deltas; each file applied exactly once; a gap refused with
the served version unchanged."""
import numpy as np
import pytest
import torch

from paramshard.online.delta_format import TableChange
from paramshard.online.delta_log import DeltaLog
from paramshard.placement.sparse_hash import initial_rows
from paramshard.server.storage.row_formats import rounded
from paramshard.serving.live_table import StoreChoice
from paramshard.serving.replica import Refused, Replica
from tests.unit.serving.delta_dir import change, delta, make_model_dir, publish


def rows(replica, table, ids):
    return replica.live_tables()[table].lookup(np.asarray(ids, np.uint64))


@pytest.fixture
def root(tmp_path):
    make_model_dir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("store", ["numpy", "compiled", "tiered"])
def test_rows_after_snapshot_and_deltas_equal_the_reference(tmp_path, dtype, store):
    make_model_dir(tmp_path, dtype)
    # tiered: the compiled store with a memory budget, rows in files under tier_dir (both copies).
    choice = StoreChoice("compiled", 16 << 20, str(tmp_path / "tier")) if store == "tiered" else StoreChoice(store)
    # Reference: a dict of id -> row, changed as each file says.
    g = np.random.default_rng(0)
    reference = {}

    def changed(ids, values, tombstones=()):
        for i in tombstones:
            reference.pop(int(i), None)
        reference.update({int(i): v for i, v in zip(ids, values)})
        from paramshard.online.delta_format import TableChange
        return {"deep": TableChange(np.asarray(ids, np.uint64), values, np.asarray(tombstones, np.uint64))}

    ids = np.arange(1, 201, dtype=np.uint64)
    publish(tmp_path, "snapshot", 0, 0, 0, changed(ids, g.standard_normal((200, 4)).astype(dtype)))
    publish(tmp_path, "delta", 0, 1, 5, changed(ids[:50], g.standard_normal((50, 4)).astype(dtype), tombstones=ids[150:160]))
    publish(tmp_path, "delta", 0, 2, 9, changed(np.arange(300, 320, dtype=np.uint64), g.standard_normal((20, 4)).astype(dtype)))
    replica = Replica(tmp_path, choice).start()
    held = np.array(sorted(reference), np.uint64)
    expected = np.stack([reference[int(i)] for i in held]).astype(np.float32)
    np.testing.assert_array_equal(rows(replica, "deep", held), expected)        # bit for bit
    assert replica.live_tables()["deep"].num_rows == len(held) == 210
    # Tombstoned and never-seen ids read their initial row in the table's format, as LocalTable's.
    gone = ids[150:160]
    np.testing.assert_array_equal(rows(replica, "deep", gone),
                                  rounded(initial_rows(replica.model_file.tables["deep"].seed, gone, 4, 0.01), dtype))
    assert replica.version["servers"] == {"0": 2} and replica.version["step"] == 9
    # Both copies hold the same rows (the back one caught up).
    a, b = (c.tables["deep"] for c in replica.buffer.copies)
    np.testing.assert_array_equal(a.lookup(held), b.lookup(held))
    if store == "tiered":
        assert sorted(p.name for p in (tmp_path / "tier").iterdir()) == ["deep-a", "deep-b", "wide-a", "wide-b"]
    replica.close()


def test_dense_blocks_write_their_slice_of_the_parameter(root):
    publish(root, "snapshot", 0, 0, 0, change([1], 1.0))
    replica = Replica(root, StoreChoice("numpy")).start()
    before = {n: p.detach().clone() for n, p in replica.buffer.copies[0].params.items()}
    assert replica.apply(delta("delta", 0, 1, 3, change([1], 2.0), {"mlp.0.weight.block1": np.arange(32, dtype=np.float32),
                                                                      "mlp.0.bias.block0": np.ones(8, np.float32)}))
    for copy in replica.buffer.copies:
        weight = copy.params["mlp.0.weight"].detach().view(-1)
        torch.testing.assert_close(weight[:40], before["mlp.0.weight"].view(-1)[:40], rtol=0, atol=0)
        torch.testing.assert_close(weight[40:], torch.arange(32, dtype=torch.float32), rtol=0, atol=0)
        torch.testing.assert_close(copy.params["mlp.0.bias"].detach(), torch.ones(8), rtol=0, atol=0)
        torch.testing.assert_close(copy.params["mlp.2.weight"].detach(), before["mlp.2.weight"], rtol=0, atol=0)
    with pytest.raises(Refused, match="dense block 'nope' is not in .*blocks.json"):
        replica.apply(delta("delta", 0, 2, 4, {}, {"nope": np.ones(3, np.float32)}))
    assert replica.version["servers"] == {"0": 1}
    replica.close()


def test_a_repeated_delta_is_a_no_op_and_a_gap_is_refused_with_the_version_unchanged(root):
    publish(root, "snapshot", 0, 0, 0, change([1, 2], 0.0))
    replica = Replica(root, StoreChoice("numpy")).start()
    first = delta("delta", 0, 1, 1, change([1], 1.0))
    assert replica.apply(first) is True
    version = replica.version
    assert replica.apply(first) is False                                   # again: nothing happens
    assert replica.apply(delta("delta", 0, 1, 1, change([1], 7.0))) is False
    np.testing.assert_array_equal(rows(replica, "deep", [1]), [[1.0] * 4])
    with pytest.raises(Refused, match="server 0: the replica applied seq 1 and the next file there is seq 3"):
        replica.apply(delta("delta", 0, 3, 3, change([2], 3.0)))
    assert replica.version == version
    np.testing.assert_array_equal(rows(replica, "deep", [2]), [[0.0] * 4])
    replica.close()


def test_following_applies_new_files_across_servers_in_the_order_written_and_reports_a_gap(root):
    publish(root, "snapshot", 0, 0, 0, change([1], 0.0), created=1.0)
    publish(root, "snapshot", 1, 0, 0, change([2], 0.0), created=1.0)
    replica = Replica(root, StoreChoice("numpy")).start()
    assert replica.poll() == 0
    # The same id set by both servers (it moved from 0 to 1): the value written last stands, whatever
    # the steps say (async: each server counts its own pushes) and whichever file the poll lists first.
    publish(root, "delta", 1, 1, 8, change([5], 8.0), created=200.0)
    publish(root, "delta", 0, 1, 9, change([5], 4.0), created=100.0)
    assert replica.poll() == 2
    np.testing.assert_array_equal(rows(replica, "deep", [5]), [[8.0] * 4])
    assert replica.version["servers"] == {"0": 1, "1": 1} and replica.version["step"] == 8
    assert replica.health()["ok"] and replica.freshness() is not None
    # Server 1's delta 2 is missing: its 3 is not applied, server 0 is still followed.
    publish(root, "delta", 1, 3, 12, change([6], 12.0))
    publish(root, "delta", 0, 2, 10, change([7], 10.0))
    assert replica.poll() == 1
    health = replica.health()
    assert not health["ok"] and "server 1: the replica applied seq 1" in health["errors"]["server 1"]
    assert health["version"]["servers"] == {"0": 2, "1": 1}
    np.testing.assert_array_equal(rows(replica, "deep", [6])[0] == 12.0, [False] * 4)
    # A snapshot past the gap: the replica starts again from the snapshots and is whole.
    publish(root, "snapshot", 1, 3, 12, change([2, 5, 6], 12.0))
    replica.poll()
    health = replica.health()
    assert health["ok"], health
    assert health["version"]["servers"] == {"0": 2, "1": 3}
    np.testing.assert_array_equal(rows(replica, "deep", [6, 7]), [[12.0] * 4, [10.0] * 4])
    replica.close()


def test_a_gap_at_start_keeps_serving_and_is_reported(root):
    publish(root, "delta", 0, 2, 2, change([1], 2.0))            # no snapshot, no delta 1
    replica = Replica(root, StoreChoice("numpy")).start()
    assert "delta 1 is missing" in replica.health()["errors"]["server 0"]
    assert replica.version["servers"] == {"0": 0}
    replica.close()


def test_a_damaged_file_is_an_error_in_health_and_nothing_is_applied(root):
    publish(root, "snapshot", 0, 0, 0, change([1], 0.0))
    replica = Replica(root, StoreChoice("numpy")).start()
    path = publish(root, "delta", 0, 1, 1, change([1], 1.0))
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    assert replica.poll() == 0
    assert "checksum" in replica.health()["errors"]["apply"]
    assert replica.version["servers"] == {"0": 0}
    assert DeltaLog(root).servers() == [0]
    replica.close()


def test_a_server_started_again_is_followed_from_its_new_snapshot(root):
    publish(root, "snapshot", 0, 0, 0, change([1, 2], 0.0))
    publish(root, "delta", 0, 1, 1, change([1], 1.0))
    replica = Replica(root, StoreChoice("numpy")).start()
    # The server restarted in place: a snapshot of seq 2 with no delta 2 (it holds only id 3 now).
    publish(root, "snapshot", 0, 2, 0, change([3], 5.0))
    assert replica.poll() == 1
    assert replica.version["servers"] == {"0": 2} and replica.health()["ok"]
    assert replica.live_tables()["deep"].num_rows == 1
    np.testing.assert_array_equal(rows(replica, "deep", [3]), [[5.0] * 4])
    publish(root, "delta", 0, 3, 1, change([3], 6.0))
    assert replica.poll() == 1
    np.testing.assert_array_equal(rows(replica, "deep", [3]), [[6.0] * 4])
    replica.close()


def test_scores_of_one_id_fields_equal_the_embedding_bag_path(tmp_path):
    """Categorical fields only (bags of one id: the served forward reads each id's row as it is, no
    de-duplication, no embedding_bag): the scores equal, bit for bit, those of the same module
    reading its rows through the training path (distinct ids, embedding_bag), for rows held,
    repeated within the request, and never seen (their initial rows)."""
    from paramshard.data import Column, Label, Schema
    from paramshard.trainer.sparse_embedding import tables_of
    schema = Schema(Label("click"), [Column("price", transforms=["log"]), Column("city", "categorical"),
                                     Column("shop", "categorical")])
    make_model_dir(tmp_path, schema=schema)
    replica = Replica(tmp_path, StoreChoice("compiled")).start()
    g = np.random.default_rng(3)
    rows = [{"price": str(g.integers(0, 100)), "city": f"c{g.integers(0, 5)}", "shop": f"s{g.integers(0, 40)}"}
            for _ in range(64)]
    batch = replica.encoder.batch_of_rows(rows)
    assert batch.offsets is None
    held = np.unique(batch.ids.astype(np.uint64))[::2]          # half the request's ids have rows
    values = g.standard_normal((len(held), 4)).astype(np.float32)
    values[0] = -0.0
    publish(tmp_path, "delta", 0, 1, 1, {"deep": TableChange(held, values, np.zeros(0, np.uint64)),
                                         "wide": TableChange(held, values[:, :1].copy(), np.zeros(0, np.uint64))})
    assert replica.poll() == 1
    served, version = replica.score_batch(batch)
    for copy in replica.buffer.copies:           # the same rows, read through the training path
        for name, embedding in tables_of(copy.module).items():
            embedding.attach(copy.tables[name].row_source("initial"), trainable=True)
    reference, same_version = replica.score_batch(batch)
    assert version == same_version and served.dtype == reference.dtype == np.float64
    assert served.tobytes() == reference.tobytes()
    replica.close()
