"""serving/versions.py: lookups during applies see one whole version, never a mix; a lookup that
holds the back copy past the grace period makes the change wait (refused, nothing changed)."""
import threading

import numpy as np
import pytest

from paramshard.serving.live_table import StoreChoice
from paramshard.serving.replica import Replica
from paramshard.serving.versions import Busy, DoubleBuffer
from tests.unit.serving.delta_dir import change, delta, make_model_dir, publish

IDS = np.arange(1, 101, dtype=np.uint64)


def test_lookups_on_another_thread_during_applies_see_whole_versions(tmp_path):
    make_model_dir(tmp_path)
    publish(tmp_path, "snapshot", 0, 0, 0, change(IDS, 0.0) | change(IDS, 0.0, "wide"))
    replica = Replica(tmp_path, StoreChoice("numpy")).start()
    seen, mixed, stop = set(), [], threading.Event()

    def read():
        while not stop.is_set():
            with replica.buffer.reading() as (copy, version):
                got = np.concatenate([copy.tables["deep"].lookup(IDS), copy.tables["wide"].lookup(IDS)], axis=1)
            seq = version["servers"]["0"]
            if not (got == seq).all():          # version v: every row of both tables holds v
                mixed.append((seq, np.unique(got)))
            seen.add(seq)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for seq in range(1, 41):
            # Each delta sets every row of both tables to its seq: a half-applied one would show.
            tables = change(IDS, float(seq)) | change(IDS, float(seq), "wide")
            replica.apply(delta("delta", 0, seq, seq, tables))
    finally:
        stop.set()
        reader.join(timeout=30)
    assert not reader.is_alive()
    assert mixed == []
    assert max(seen) <= 40 and len(seen) >= 2        # it read while versions changed
    assert replica.buffer.switches == 41              # start + 40 deltas
    replica.close()


def test_a_reader_holding_the_back_copy_past_the_grace_period_refuses_the_change():
    copies = ([0], [0])

    def add(n):
        return lambda copy: copy.__setitem__(0, copy[0] + n)

    buffer = DoubleBuffer(*copies, version={"n": 0}, grace=0.05)
    held = buffer.reading()
    copy, version = held.__enter__()             # a lookup reading copy 0, the live one
    buffer.apply(add(1), {"n": 1})                # copy 1 changed and live; copy 0 still read: it lags
    assert buffer.version == {"n": 1} and copies == ([0], [1])
    with pytest.raises(Busy, match="1 lookup.* still read .* after 0.05 s"):
        buffer.apply(add(2), {"n": 3})            # copy 0 must be written next: its reader is still there
    assert buffer.version == {"n": 1} and copies == ([0], [1])
    held.__exit__(None, None, None)
    buffer.apply(add(2), {"n": 3})                # copy 0 catches up (+1), takes the change (+2), goes live
    assert buffer.version == {"n": 3} and copies == ([3], [3])
