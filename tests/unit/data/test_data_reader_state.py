"""A reader's position survives a checkpoint: restore(state()) hands out exactly the
batches an uninterrupted reader would have, in every pass."""
import json

import numpy as np
import pytest

from paramshard.data import CriteoReader, LibsvmReader
from paramshard.errors import ConfigError
from tests.unit.data.test_data_criteo import line, write


def labels(batches):
    return [b.labels.tolist() for b in batches]


@pytest.fixture
def criteo_files(tmp_path):
    rng = np.random.default_rng(0)
    paths = []
    for f in range(3):
        lines = [line(label=str(int(rng.random() < 0.5)), ints=[str(rng.integers(0, 9))] * 13) for _ in range(37)]
        if f == 1:
            lines.insert(5, "not a criteo line")                   # a bad line, skipped
        paths.append(tmp_path / f"part-{f}")
        write(paths[-1], lines)
    return paths


@pytest.mark.parametrize("stop_after", [0, 1, 7, 13])
def test_criteo_reader_resumes_mid_pass_and_in_later_passes(criteo_files, stop_after):
    whole = CriteoReader(criteo_files, batch_size=8, skip_bad_lines=True, chunk_bytes=300)
    expected = [labels(whole) for _ in range(2)]                     # two passes

    first = CriteoReader(criteo_files, batch_size=8, skip_bad_lines=True, chunk_bytes=300)
    got = []
    for k, batch in enumerate(first):
        if k == stop_after:
            break
        got.append(batch.labels.tolist())
    saved = json.loads(json.dumps(first.state()))                    # it goes through a JSON file
    assert saved == {"epoch": 0, "batches": stop_after + 1}

    second = CriteoReader(criteo_files, batch_size=8, skip_bad_lines=True, chunk_bytes=300)
    second.restore({"epoch": saved["epoch"], "batches": saved["batches"] - 1})   # the last one was not trained
    got += labels(second)
    assert got == expected[0]
    assert second.state()["epoch"] == 0
    assert labels(second) == expected[1] and second.state()["epoch"] == 1


def test_libsvm_reader_keeps_its_position_too(tmp_path):
    path = tmp_path / "a.svm"
    path.write_text("".join(f"{i % 2} {i}:1 {i + 1}:0.5\n" for i in range(50)))
    whole = [b.labels.tolist() for b in LibsvmReader(path, batch_size=6)]
    r = LibsvmReader(path, batch_size=6)
    r.restore({"epoch": 0, "batches": 4})
    assert [b.labels.tolist() for b in r] == whole[4:]


def test_a_bad_state_is_refused():
    r = LibsvmReader.__new__(LibsvmReader)
    with pytest.raises(ConfigError, match="expected"):
        LibsvmReader.restore(r, {"epoch": "x"})
    with pytest.raises(ConfigError, match="batches must be >= 0"):
        LibsvmReader.restore(r, {"epoch": 0, "batches": -1})
