"""LibsvmReader: hand-written expectations, every broken-line kind, and the
vectorised fast path against the per-line reference parser."""
import random

import numpy as np
import pytest

from paramshard.data import CriteoBatch, CriteoReader, DataFormatError, LibsvmReader, SparseBatch
from paramshard.data.readers.libsvm import parse_fast, parse_slow
from paramshard.errors import ConfigError


def write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def read_all(path, batch_size=1000, **kw):
    reader = LibsvmReader(path, batch_size, **kw)
    return SparseBatch.concat(list(reader)), reader


def test_libsvm_values(tmp_path):
    path = write(tmp_path / "a.svm", ["1 3:0.5 10:1", "-1 7:2e-3", "+1", "0\t18446744073709551615:-1.25  4:.5 "])
    b, _ = read_all(path)
    assert b.labels.tolist() == [1, 0, 1, 0] and b.labels.dtype == np.float32
    assert b.offsets.tolist() == [0, 2, 3, 3, 5] and b.offsets.dtype == np.int64
    assert b.ids.tolist() == [3, 10, 7, 2**64 - 1, 4] and b.ids.dtype == np.uint64
    np.testing.assert_array_equal(b.values, np.array([0.5, 1, 0.002, -1.25, 0.5], np.float32))
    assert b.fields is None


def test_libffm_values(tmp_path):
    b, _ = read_all(write(tmp_path / "a.ffm", ["0 0:5:1 1:7:0.25", "1 2:5:3"]))
    assert b.fields.tolist() == [0, 1, 2] and b.fields.dtype == np.int32
    assert b.ids.tolist() == [5, 7, 5]
    assert b.values.tolist() == [1, 0.25, 3]
    assert b.offsets.tolist() == [0, 2, 3]


def test_batches_and_take_keep_rows_whole(tmp_path):
    lines = [f"{i % 2} " + " ".join(f"{i}{j}:{j}" for j in range(i % 4)) for i in range(25)]
    whole, _ = read_all(write(tmp_path / "a.svm", lines))
    batches = list(LibsvmReader(tmp_path / "a.svm", 6, chunk_bytes=50))
    assert [len(b) for b in batches] == [6, 6, 6, 6, 1]
    for b in batches:
        assert b.offsets[0] == 0 and b.offsets[-1] == len(b.ids)
    again = SparseBatch.concat(batches)
    for name in ("labels", "ids", "values", "offsets"):
        np.testing.assert_array_equal(getattr(again, name), getattr(whole, name))


BROKEN = [
    ("", "empty line"),
    ("   ", "empty line"),
    ("2 1:1", "label must be 0, 1, -1 or +1, got '2'"),
    ("1.0 1:1", "label must be 0, 1, -1 or +1"),
    ("1 1:1 5", "feature 2 is not idx:val: '5'"),
    ("1 1:1:1", "feature 1 is not idx:val"),
    ("1 :1", "feature 1 is not idx:val: ':1'"),
    ("1 3:", "feature 1 is not idx:val: '3:'"),
    ("1 -3:1", "index must be an integer in [0, 2**64), got '-3'"),
    ("1 x:1", "index must be an integer"),
    ("1 18446744073709551616:1", "index must be an integer in [0, 2**64)"),
    ("1 3:abc", "value must be a finite float32 number, got 'abc'"),
    ("1 3:nan", "value must be a finite float32 number"),
    ("1 3:1e39", "value must be a finite float32 number"),
    ("1 3:1.2.3", "value must be a finite float32 number"),
]


@pytest.mark.parametrize("bad,reason", BROKEN)
def test_each_broken_line_names_file_line_and_reason(tmp_path, bad, reason):
    path = write(tmp_path / "train.svm", ["1 1:1", "0 2:1", bad, "1 3:1"])
    with pytest.raises(DataFormatError) as err:
        read_all(path, format="libsvm")
    assert str(err.value).startswith(f"{path}:3: ") and reason in str(err.value)


@pytest.mark.parametrize("bad,reason", [
    ("1 1:1", "feature 1 is not field:idx:val: '1:1'"),
    ("1 x:1:1", "field must be an integer in [0, 2**31), got 'x'"),
    ("1 2147483648:1:1", "field must be an integer in [0, 2**31)"),
])
def test_broken_libffm_lines(tmp_path, bad, reason):
    path = write(tmp_path / "train.ffm", ["1 0:1:1", bad])
    with pytest.raises(DataFormatError, match=rf"^{path}:2: ") as err:
        read_all(path)  # auto-detected as libffm from line 1
    assert reason in str(err.value)


def test_skip_mode_counts_and_keeps_good_lines(tmp_path):
    lines = []
    for i, (bad, _) in enumerate(BROKEN):
        lines += [f"{i % 2} {i}:{i}", bad]
    b, reader = read_all(write(tmp_path / "a.svm", lines), batch_size=4, skip_bad_lines=True)
    assert reader.bad_lines == len(BROKEN)
    assert b.ids.tolist() == list(range(len(BROKEN)))
    assert b.labels.tolist() == [i % 2 for i in range(len(BROKEN))]


def test_format_argument(tmp_path):
    path = write(tmp_path / "a.ffm", ["1 0:1:1"])
    with pytest.raises(DataFormatError, match="is not idx:val"):
        read_all(path, format="libsvm")
    with pytest.raises(ConfigError, match="format="):
        LibsvmReader(path, 1, format="csv")


def test_ids_equal_across_readers(tmp_path):
    """The same rows as Criteo TSV and as libffm written with the Criteo ids give the same ids."""
    rows = [["1", *[str(j) for j in range(13)], *[f"{(i * 31 + j) % 7:x}" if j % 5 else "" for j in range(26)]]
            for i in range(12)]
    crit = write(tmp_path / "d.txt", ["\t".join(r) for r in rows])
    c = CriteoBatch.concat(list(CriteoReader(crit, 5)))
    ffm = write(tmp_path / "d.ffm", [f"{int(lab)} " + " ".join(f"{f}:{int(i)}:1" for f, i in enumerate(ids))
                                     for lab, ids in zip(c.labels, c.sparse_ids)])
    s, _ = read_all(ffm)
    np.testing.assert_array_equal(s.ids.reshape(c.sparse_ids.shape), c.sparse_ids)
    np.testing.assert_array_equal(s.fields.reshape(-1, 26), np.tile(np.arange(26), (12, 1)))


def _random_line(rng, parts):
    def value():
        return rng.choice([str(rng.randint(-9, 9)), f"{rng.uniform(-1e3, 1e3):.{rng.randint(0, 7)}f}",
                           f"{rng.uniform(-1, 1):.3e}", "+0.5", "-.25", "7.", "0012", "1E5"])

    def index():
        return str(rng.choice([rng.randint(0, 9), rng.getrandbits(32), rng.getrandbits(64), 2**64 - 1]))

    feats = []
    for _ in range(rng.randint(0, 6)):
        head = f"{rng.randint(0, 2**31 - 1)}:" if parts == 3 else ""
        feats.append(f"{head}{index()}:{value()}")
    return rng.choice(["0", "1", "-1", "+1"]) + rng.choice([" ", "\t", "  "]) + " ".join(feats)


@pytest.mark.parametrize("parts", [2, 3])
def test_fast_path_equals_reference_parser(parts):
    rng = random.Random(parts)
    buf = ("\n".join(_random_line(rng, parts) for _ in range(400)) + "\n").encode().replace(b"\t", b" ")
    fast = parse_fast(buf, parts)
    slow, bad = parse_slow(buf, parts)
    assert bad == []
    for name in ("labels", "ids", "values", "offsets", "fields"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name), err_msg=name)


def test_fuzzed_lines_read_like_reference(tmp_path):
    rng = random.Random(11)
    lines = []
    for i in range(500):
        text = _random_line(rng, 2)
        if i % 4 == 0 and text:
            pos = rng.randrange(len(text))
            text = text[:pos] + rng.choice("0:.-x e+") + text[pos + rng.randint(0, 1):]
        lines.append(text)
    got, reader = read_all(write(tmp_path / "f.svm", lines), batch_size=33, skip_bad_lines=True,
                           format="libsvm", chunk_bytes=2048)
    ref, bad = parse_slow(("\n".join(lines) + "\n").encode(), 2)
    assert reader.bad_lines == len(bad) > 20
    for name in ("labels", "ids", "values", "offsets"):
        np.testing.assert_array_equal(getattr(got, name), getattr(ref, name), err_msg=name)
