"""DirectoryStream: growing and new files, whole lines only, CSV/JSON lines/Parquet, every
record to exactly one rank."""
import json

import pytest

from paramshard.data import DirectoryStream, StreamSource
from paramshard.data.errors import DataFormatError
from tests.unit.data.stream.stream_files import append, csv_rows, drain, ids_of, jsonl_rows, write_parquet


def test_a_growing_csv_gives_whole_lines_only(tmp_path):
    stream = DirectoryStream(tmp_path)
    assert isinstance(stream, StreamSource)
    assert stream.poll(10, 0) is None
    append(tmp_path / "a.csv", "id,label,ci")                     # the header is not whole yet
    assert stream.poll(10, 0) is None
    append(tmp_path / "a.csv", "ty\n0,0,x\n1,1,y\n2,0,")          # record 2's line has no newline yet
    batch = stream.poll(10, 0)
    assert ids_of(batch) == [0, 1] and list(batch.records.columns) == ["id", "label", "city"]
    assert batch.records["city"].tolist() == ["x", "y"]           # read as text, as the CSV readers do
    assert batch.position["files"]["a.csv"]["records"] == 2
    assert stream.poll(10, 0) is None                             # still no newline
    append(tmp_path / "a.csv", "z\n3,1,w\n")
    batch = stream.poll(10, 0)
    assert ids_of(batch) == [2, 3] and batch.records["city"].tolist() == ["z", "w"]
    assert batch.arrived is not None


def test_new_files_in_name_order_and_max_records(tmp_path):
    append(tmp_path / "b.csv", csv_rows(range(10, 15), header=True))
    append(tmp_path / "a.csv", csv_rows(range(0, 5), header=True))
    (tmp_path / ".c.csv").write_text(csv_rows(range(99, 100), header=True))    # hidden: unfinished
    (tmp_path / "d.csv.tmp").write_text(csv_rows(range(98, 99), header=True))
    stream = DirectoryStream(tmp_path)
    assert ids_of(stream.poll(3, 0)) == [0, 1, 2]
    assert ids_of(stream.poll(4, 0)) == [3, 4, 10, 11]             # a batch spans files, name order
    append(tmp_path / "a.csv", csv_rows([5]))                      # earlier name, later growth
    append(tmp_path / "c.csv", csv_rows([20], header=True))        # a new file
    assert drain(stream) == [5, 12, 13, 14, 20]


def test_jsonl_and_parquet_and_event_time(tmp_path):
    append(tmp_path / "a.jsonl", jsonl_rows(range(3)))
    (tmp_path / "b.parquet.tmp").write_bytes(b"not yet")           # a writer's temporary name: never read
    write_parquet(tmp_path, "b.parquet", range(3, 8))
    stream = DirectoryStream(tmp_path, time_column="ts")
    batch = stream.poll(4, 0)
    assert ids_of(batch) == [0, 1, 2, 3] and batch.arrived == 1000.0
    assert batch.position["files"] == {"a.jsonl": {"bytes": len(jsonl_rows(range(3))), "records": 3},
                                       "b.parquet": {"records": 1}}
    assert drain(stream, 2) == [4, 5, 6, 7]


@pytest.mark.parametrize("speeds", [(1, 1), (1, 7), (5, 2)])
def test_two_ranks_read_every_record_once(tmp_path, speeds):
    readers = [DirectoryStream(tmp_path, rank, 2) for rank in range(2)]
    taken, written, next_id = [[], []], [], 0
    for round_ in range(6):
        # The writer appends to a growing CSV and a growing JSON-lines file, and adds a Parquet file.
        for name, rows in (("a.csv", csv_rows), ("b.jsonl", jsonl_rows)):
            ids = list(range(next_id, next_id + 5))
            path = tmp_path / name
            append(path, rows(ids, header=True) if name.endswith("csv") and not path.exists() else rows(ids))
            written += ids
            next_id += 5
        ids = list(range(next_id, next_id + 3))
        write_parquet(tmp_path, f"p{round_}.parquet", ids)
        written += ids
        next_id += 3
        for rank, reader in enumerate(readers):       # trainers at different speeds
            got = reader.poll(speeds[rank], 0)
            taken[rank] += ids_of(got)
    for rank, reader in enumerate(readers):
        taken[rank] += drain(reader)
    assert sorted(taken[0] + taken[1]) == sorted(written)          # each record once
    assert abs(len(taken[0]) - len(taken[1])) <= 8                  # by record index: shares balance


def test_a_bad_line_is_named_and_takes_nothing(tmp_path):
    append(tmp_path / "a.jsonl", jsonl_rows(range(2)) + "[1, 2]\n")
    stream = DirectoryStream(tmp_path)
    before = stream.position()
    with pytest.raises(DataFormatError, match=r"a.jsonl: record 2 \(byte \d+\) is a JSON list"):
        stream.poll(10, 0)
    assert stream.position() == before


def test_a_truncated_file_is_refused(tmp_path):
    append(tmp_path / "a.jsonl", jsonl_rows(range(4)))
    stream = DirectoryStream(tmp_path)
    drain(stream)
    (tmp_path / "a.jsonl").write_text(jsonl_rows([0]))
    with pytest.raises(DataFormatError, match="truncated or replaced"):
        stream.poll(1, 0)


def test_format_and_rank_are_checked(tmp_path):
    with pytest.raises(ValueError, match="rank 2 of world 2"):
        DirectoryStream(tmp_path, 2, 2)
    with pytest.raises(ValueError, match="format 'xml'"):
        DirectoryStream(tmp_path, format="xml")
    with pytest.raises(ValueError, match="does not exist"):
        DirectoryStream(tmp_path / "missing")
    (tmp_path / "events.log").write_text(json.dumps({"id": 1}) + "\n")
    assert DirectoryStream(tmp_path).poll(1, 0) is None                       # unknown suffix: not read
    assert ids_of(DirectoryStream(tmp_path, format="jsonl").poll(1, 0)) == [1]


def test_a_file_read_out_is_not_read_again(tmp_path, monkeypatch):
    import pyarrow.parquet as pq
    write_parquet(tmp_path, "a.parquet", range(3))
    append(tmp_path / "b.jsonl", jsonl_rows(range(3, 5)))
    stream = DirectoryStream(tmp_path)
    reads = []
    real = pq.read_table
    monkeypatch.setattr(pq, "read_table", lambda *a, **k: reads.append(a) or real(*a, **k))
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: opened.append(str(path)) or real_open(path, *a, **k))
    assert drain(stream) == [0, 1, 2, 3, 4]
    reads.clear(), opened.clear()
    for _ in range(3):
        assert stream.poll(10, 0) is None
    assert reads == [] and opened == []


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_what_paramshard_replay_appends_is_read_once_by_two_ranks(tmp_path, fmt):
    import pandas as pd
    from paramshard.data.stream.replay import DirectoryAppender
    frame = pd.DataFrame({"id": range(30), "c": ["a", "b,c", 'd"e'] * 10})     # quoted CSV fields too
    appender = DirectoryAppender(tmp_path, fmt, file_rows=8)
    readers = [DirectoryStream(tmp_path, rank, 2) for rank in range(2)]
    taken = []
    for start in range(0, 30, 7):           # appends between the readers' polls
        appender.append(frame.iloc[start:start + 7])
        for reader in readers:
            if (batch := reader.poll(3, 0)) is not None:
                taken.append(batch.records)
    taken += [b.records for r in readers for b in iter(lambda r=r: r.poll(100, 0), None)]
    back = pd.concat(taken, ignore_index=True).astype({"id": int}).sort_values("id", ignore_index=True)
    pd.testing.assert_frame_equal(back, frame, check_dtype=False)
