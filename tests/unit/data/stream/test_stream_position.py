"""A DirectoryStream's position: seek after it gives exactly the rest; a damaged one is refused,
naming the field."""
import copy
import json

import pytest

from paramshard.data import DirectoryStream
from paramshard.data.stream.errors import PositionError
from tests.unit.data.stream.stream_files import append, csv_rows, drain, ids_of, jsonl_rows, write_parquet


def fill(directory):
    append(directory / "a.csv", csv_rows(range(0, 9), header=True))
    append(directory / "b.jsonl", jsonl_rows(range(9, 16)))
    write_parquet(directory, "c.parquet", range(16, 27))
    return list(range(27))


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("cut", [1, 3, 5, 7])
def test_seek_after_a_position_gives_exactly_the_rest(tmp_path, world, cut):
    written = fill(tmp_path)
    seen, cuts = [], []
    for rank in range(world):
        first = DirectoryStream(tmp_path, rank, world)
        before = []
        while len(before) < cut and (batch := first.poll(2, 0)) is not None:    # stops inside a file
            before += ids_of(batch)
        saved = json.loads(json.dumps(batch.position))      # as a checkpoint keeps it
        assert saved == first.position()
        cuts.append((first, before, saved))
    append(tmp_path / "b.jsonl", jsonl_rows([100, 101]))    # the file grows after the saves
    written += [100, 101]
    for rank, (first, before, saved) in enumerate(cuts):
        resumed = DirectoryStream(tmp_path, rank, world)
        resumed.seek(saved)
        rest = drain(resumed, 3)
        assert rest == drain(first, 3)          # the same records as reading on
        seen += before + rest
    assert sorted(seen) == sorted(written)      # nothing lost, nothing twice


def test_a_position_of_an_empty_start_reads_everything(tmp_path):
    written = fill(tmp_path)
    stream = DirectoryStream(tmp_path)
    start = stream.position()
    drain(stream)
    stream.seek(start)
    assert drain(stream) == written


DAMAGE = [
    (lambda p: p.update(source="kafka"), "'source'"),
    (lambda p: p.update(version=2), "'version'"),
    (lambda p: p.update(world=3), "rank 0 of world 3"),
    (lambda p: p.update(rank="0"), "'rank' must be a whole number"),
    (lambda p: p.update(files=[]), "'files' must be a JSON object"),
    (lambda p: p["files"].update({"../x.csv": {"bytes": 0, "records": 0}}), r"files\['../x.csv'\]"),
    (lambda p: p["files"]["a.csv"].update(bytes=-1), r"files\['a.csv'\].bytes must be a whole number"),
    (lambda p: p["files"]["a.csv"].update(bytes=7), r"files\['a.csv'\].bytes=7 is not at a line end"),
    (lambda p: p["files"]["a.csv"].update(bytes=10 ** 9), r"files\['a.csv'\].bytes is 1000000000.*truncated"),
    (lambda p: p["files"]["a.csv"].pop("records"), r"files\['a.csv'\] has no 'records'"),
    (lambda p: p["files"]["a.csv"].update(offset=1), r"files\['a.csv'\] has unknown fields \['offset'\]"),
    (lambda p: p["files"]["c.parquet"].update(bytes=5), r"files\['c.parquet'\].bytes: .* read by rows"),
    (lambda p: p["files"]["b.jsonl"].update(records=True), r"files\['b.jsonl'\].records must be a whole number"),
    (lambda p: p["files"].update({".hidden.csv": {"bytes": 0, "records": 0}}), r"not a stream file"),
]


@pytest.mark.parametrize("damage,named", DAMAGE)
def test_a_damaged_position_is_refused_naming_the_field(tmp_path, damage, named):
    fill(tmp_path)
    stream = DirectoryStream(tmp_path)
    drain(stream, 5)
    position = stream.position()
    before = copy.deepcopy(position)
    damaged = copy.deepcopy(position)
    damage(damaged)
    other = DirectoryStream(tmp_path)
    other.seek(before)
    with pytest.raises(PositionError, match=named):
        other.seek(damaged)
    assert other.position() == before       # nothing moved


def test_a_position_that_is_not_an_object_is_refused(tmp_path):
    with pytest.raises(PositionError, match="must be a JSON object, got list"):
        DirectoryStream(tmp_path).seek([])
