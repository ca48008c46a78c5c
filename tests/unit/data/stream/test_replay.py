"""Replaying a table into a directory: the files, read back in name order, are the table, once."""
import json

import numpy as np
import pandas as pd
import pytest

from paramshard.cli.main import main
from paramshard.data.stream.replay import DirectoryAppender, append_log_line, replay
from paramshard.errors import ConfigError


def table(n=23):
    rng = np.random.default_rng(0)
    return pd.DataFrame({"id": np.arange(n), "c": rng.choice(["a", "b,c", 'd"e'], n), "x": rng.random(n).round(6),
                         "label": rng.integers(0, 2, n)})


def read_back(directory, fmt):
    files = sorted(directory.glob(f"events-*.{fmt}"))
    read = {"csv": pd.read_csv, "jsonl": lambda p: pd.read_json(p, lines=True), "parquet": pd.read_parquet}[fmt]
    return files, pd.concat([read(f) for f in files], ignore_index=True)


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_the_files_in_name_order_are_the_records_once(tmp_path, fmt):
    frame, log = table(), []
    assert replay(frame, tmp_path, rate=0, fmt=fmt, file_rows=10, loops=2, on_append=log.append) == 46
    files, back = read_back(tmp_path, fmt)
    pd.testing.assert_frame_equal(back, pd.concat([frame, frame], ignore_index=True), check_dtype=False)
    assert [a.first for a in log] == list(np.cumsum([0] + [a.count for a in log[:-1]]))
    if fmt != "parquet":
        assert len(files) == 5          # 10 + 10 + 10 + 10 + 6
    assert not list(tmp_path.glob(".*"))


def test_a_second_run_starts_a_new_file_and_max_rows_stops_it(tmp_path):
    replay(table(), tmp_path, rate=0, file_rows=100)
    replay(table(), tmp_path, rate=0, file_rows=100, max_rows=5)
    files, back = read_back(tmp_path, "csv")
    assert [f.name for f in files] == ["events-000001.csv", "events-000002.csv"] and len(back) == 28


def test_log_lines_and_bad_settings(tmp_path):
    appended = DirectoryAppender(tmp_path, "csv").append(table(3))
    line = json.loads(append_log_line(appended[0]))
    assert (line["first"], line["count"], line["file"]) == (0, 3, "events-000001.csv") and line["at"] > 0
    with pytest.raises(ConfigError, match="expected one of"):
        DirectoryAppender(tmp_path, "xml")
    with pytest.raises(ConfigError, match="must be >= 1"):
        DirectoryAppender(tmp_path, "csv", file_rows=0)


def test_the_command(tmp_path, capsys):
    table().to_csv(tmp_path / "data.csv", index=False)
    code = main(["replay", str(tmp_path / "data.csv"), "--into", str(tmp_path / "ev"), "--rate", "0",
                 "--log", str(tmp_path / "log.jsonl")])
    assert code == 0 and "23 records appended" in capsys.readouterr().out
    assert sum(json.loads(line)["count"] for line in open(tmp_path / "log.jsonl")) == 23
