"""rebuild(): servers' files merged in the order they were written, not by their steps."""
import numpy as np
import pytest

from paramshard.online.delta_format import Delta, DeltaError, TableChange
from paramshard.online.delta_log import DeltaLog
from paramshard.online.rebuild import rebuild


def publish(root, kind, server, seq, step, ids, value, created, tombstones=()):
    change = TableChange(np.array(ids, np.uint64), np.full((len(ids), 2), value, np.float32),
                         np.array(tombstones, np.uint64), version=step)
    DeltaLog(root).publish(Delta(kind, server, seq, step, created, {"t": change}, {}))


def test_a_moved_row_takes_its_new_owners_value_whatever_the_steps(tmp_path):
    publish(tmp_path, "snapshot", 0, 0, 0, [1, 5], 0.0, created=1.0)
    publish(tmp_path, "snapshot", 1, 0, 0, [2], 0.0, created=1.0)
    # Row 5 moved from server 0 to server 1: server 0 published it last before the move (its async
    # step count is high), server 1 after the hand-off (its own count is lower).
    publish(tmp_path, "delta", 0, 1, 900, [5], 4.0, created=10.0)
    publish(tmp_path, "delta", 1, 1, 30, [5], 8.0, created=20.0)
    publish(tmp_path, "delta", 0, 2, 950, [1], 1.0, created=30.0, tombstones=[])
    model = rebuild(tmp_path)
    ids, rows = model.table("t")
    assert ids.tolist() == [1, 2, 5]
    assert rows[:, 0].tolist() == [1.0, 0.0, 8.0]
    assert model.seqs == {0: 2, 1: 1} and model.steps == {0: 950, 1: 30}


def test_tombstones_remove_and_a_gap_is_refused(tmp_path):
    publish(tmp_path, "snapshot", 0, 0, 0, [1, 2], 0.0, created=1.0)
    publish(tmp_path, "delta", 0, 1, 1, [], 0.0, created=2.0, tombstones=[2])
    assert rebuild(tmp_path).table("t")[0].tolist() == [1]
    publish(tmp_path, "delta", 0, 3, 3, [1], 3.0, created=3.0)
    with pytest.raises(DeltaError, match="seq 2 is missing"):
        rebuild(tmp_path)
