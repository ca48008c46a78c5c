"""split_lines and shard_files: parts are an exact round-robin partition of the input."""
import gzip

import pytest

from paramshard.data import shard_files, split_lines
from paramshard.data.shards import split as split_module
from paramshard.errors import ConfigError


@pytest.fixture
def inputs(tmp_path):
    a = tmp_path / "a.txt"
    a.write_bytes(b"".join(b"a%d\n" % i for i in range(23)))
    b = tmp_path / "b.txt"
    b.write_bytes(b"b0\n\nb2\tx\nb3")  # an empty line and no final newline
    return [a, b], [b"a%d\n" % i for i in range(23)] + [b"b0\n", b"\n", b"b2\tx\n", b"b3\n"]


@pytest.mark.parametrize("shards", [1, 3, 4, 27, 30])
@pytest.mark.parametrize("hint", [1, 10, 1 << 20])  # readlines() blocks of 1 line .. whole file
def test_line_i_goes_to_shard_i_mod_n(tmp_path, inputs, shards, hint, monkeypatch):
    monkeypatch.setattr(split_module, "_READ_HINT", hint)
    paths, lines = inputs
    report = split_lines(paths, shards, tmp_path / "out")
    assert [p.name for p in report.parts] == [f"part-{k:05d}" for k in range(shards)]
    for k, part in enumerate(report.parts):
        assert part.read_bytes().splitlines(keepends=True) == lines[k::shards]
        assert report.lines[k] == len(lines[k::shards])
    assert sum(report.lines) == len(lines)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [p.name for p in report.parts]  # no .tmp


def test_split_by_files(tmp_path, inputs):
    paths, _ = inputs
    c = tmp_path / "c.txt.gz"
    with gzip.open(c, "wb") as f:
        f.write(b"c0\nc1\n")
    report = split_lines([*paths, c], 2, tmp_path / "out", by="files")
    assert report.parts[0].read_bytes() == paths[0].read_bytes() + b"c0\nc1\n"
    assert report.parts[1].read_bytes() == paths[1].read_bytes() + b"\n"
    assert report.lines == (25, 4)
    with pytest.raises(ConfigError, match="3 input file.* cannot fill 4 shards"):
        split_lines([*paths, c], 4, tmp_path / "out4", by="files")


def test_existing_parts_need_force_and_are_replaced(tmp_path, inputs):
    paths, _ = inputs
    out = tmp_path / "out"
    split_lines(paths, 4, out)
    with pytest.raises(ConfigError, match="already holds 4 part file"):
        split_lines(paths, 2, out)
    split_lines(paths, 2, out, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["part-00000", "part-00001"]


def test_split_config_errors(tmp_path, inputs):
    paths, _ = inputs
    with pytest.raises(ConfigError, match="--shards must be >= 1, got 0"):
        split_lines(paths, 0, tmp_path / "out")
    with pytest.raises(ConfigError, match="missing.txt: no such file"):
        split_lines([paths[0], tmp_path / "missing.txt"], 2, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing written on a bad call


def test_shard_files_deals_parts_to_trainers(tmp_path, inputs):
    paths, _ = inputs
    out = split_lines(paths, 6, tmp_path / "out").out_dir
    assert [p.name for p in shard_files(out, 1, 3)] == ["part-00001", "part-00004"]
    assert [p.name for p in shard_files(out, 0, 6)] == ["part-00000"]
    every = sorted(p for t in range(4) for p in shard_files(out, t, 4))
    assert every == sorted(out.iterdir())  # each part read by exactly one trainer
    assert [p.name for p in shard_files(str(out / "part-*"), 2, 3)] == ["part-00002", "part-00005"]


def test_shard_files_errors(tmp_path, inputs):
    paths, _ = inputs
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="no data files in .*empty.*split-data"):
        shard_files(empty, 0, 1)
    with pytest.raises(ConfigError, match="no data files"):
        shard_files(tmp_path / "nothing-*", 0, 1)
    out = split_lines(paths, 2, tmp_path / "out").out_dir
    with pytest.raises(ConfigError, match="has 2 part.* for 3 trainers.*--shards 3"):
        shard_files(out, 0, 3)
    with pytest.raises(ConfigError, match="trainer 3 of 3"):
        shard_files(out, 3, 3)
    (out / "part-00000").unlink()
    with pytest.raises(ConfigError, match="part-00000 is missing"):
        shard_files(out, 0, 1)
