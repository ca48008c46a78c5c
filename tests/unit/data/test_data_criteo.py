"""CriteoReader against hand-written expectations and a plain-Python reference parser."""
import gzip
import math
import random
import zlib

import numpy as np
import pytest

from paramshard.data import CriteoBatch, CriteoReader, DataFormatError
from paramshard.errors import ConfigError

MISSING = 0xFFFFFFFF


def line(label="1", ints=None, cats=None):
    ints = ints if ints is not None else [str(i) for i in range(13)]
    cats = cats if cats is not None else [f"{0x10 * (i + 1):08x}" for i in range(26)]
    assert len(ints) == 13 and len(cats) == 26
    return "\t".join([label, *ints, *cats])


def write(path, lines, end="\n"):
    path.write_text(end.join(lines) + end)
    return path


def read_all(paths, batch_size=1000, **kw):
    reader = CriteoReader(paths, batch_size, **kw)
    batches = list(reader)
    return (CriteoBatch.concat(batches) if batches else None), reader


def reference(text_line):
    """The spec, one field at a time: (label, dense[13], ids[26]) or None for a bad line."""
    cols = text_line.split("\t")
    if len(cols) != 40 or cols[0] not in ("0", "1"):
        return None
    dense = []
    for v in cols[1:14]:
        if v and not (v.lstrip("-").isdigit() and v.count("-") <= 1 and (v[0] != "-" or len(v) > 1)
                      and v.isascii() and len(v.lstrip("-")) <= 18):
            return None
        dense.append(np.log1p(np.float32(max(int(v), 0))) if v else np.float32(0))
    ids = []
    for f, v in enumerate(cols[14:]):
        if v and not all(c in "0123456789abcdefABCDEF" for c in v):
            return None
        value = MISSING if not v else int(v, 16) if len(v) <= 8 else zlib.crc32(v.lower().encode())
        ids.append((f << 32) | value)
    return float(cols[0]), np.array(dense, np.float32), np.array(ids, np.uint64)


def test_values_match_hand_written_expectations(tmp_path):
    ints = ["", "0", "-2", "1", "9", "12345", "", "7", "0", "0", "3", "4", "100000000000"]
    cats = ["68fd1e64", "", "0a", "A", "FFFFFFFF", "00000000", "123456789abc", *["1"] * 19]
    path = write(tmp_path / "d.txt", [line("1", ints, cats), line("0")])
    b, reader = read_all(path)
    assert b.labels.dtype == np.float32 and b.labels.tolist() == [1.0, 0.0]
    assert b.dense.dtype == np.float32 and b.dense.shape == (2, 13)
    expected = [0, 0, 0, math.log1p(1), math.log1p(9), math.log1p(12345), 0, math.log1p(7), 0, 0,
                math.log1p(3), math.log1p(4), math.log1p(1e11)]
    np.testing.assert_allclose(b.dense[0], expected, rtol=1e-6)
    np.testing.assert_allclose(b.dense[1], np.log1p(np.arange(13)), rtol=1e-6)
    assert b.sparse_ids.dtype == np.uint64 and b.sparse_ids.shape == (2, 26)
    assert [int(x) for x in b.sparse_ids[0, :7]] == [
        0x68FD1E64, (1 << 32) | MISSING, (2 << 32) | 0xA, (3 << 32) | 0xA, (4 << 32) | 0xFFFFFFFF,
        5 << 32, (6 << 32) | zlib.crc32(b"123456789abc")]
    assert [int(x) for x in b.sparse_ids[1, :3]] == [0x10, (1 << 32) | 0x20, (2 << 32) | 0x30]
    assert reader.bad_lines == 0


def test_ids_unique_per_field_and_value(tmp_path):
    values = ["00000001", "00000002", "deadbeef"]
    lines = [line(cats=[v] * 26) for v in values] + [line(cats=[values[0]] * 26)]
    b, _ = read_all(write(tmp_path / "d.txt", lines))
    ids = b.sparse_ids
    assert len(np.unique(ids[:3])) == 3 * 26  # every (field, value) pair its own id
    np.testing.assert_array_equal(ids[0], ids[3])  # same (field, value) -> same id
    np.testing.assert_array_equal(ids[:3] >> np.uint64(32), np.tile(np.arange(26), (3, 1)))


def test_long_value_hash_ignores_case(tmp_path):
    b, _ = read_all(write(tmp_path / "d.txt", [line(cats=["ABCDEF0123"] * 26), line(cats=["abcdef0123"] * 26)]))
    np.testing.assert_array_equal(b.sparse_ids[0], b.sparse_ids[1])


BROKEN = [
    ("1\t2\t3", "expected 40 tab-separated columns, got 3"),
    (line() + "\textra", "expected 40 tab-separated columns, got 41"),
    ("", "expected 40 tab-separated columns, got 1 (empty line)"),
    (line(label="2"), "label (column 1) must be 0 or 1, got '2'"),
    (line(label=""), "label (column 1) must be 0 or 1, got ''"),
    (line(label="1.0"), "label (column 1) must be 0 or 1"),
    (line(ints=["1.5"] + ["1"] * 12), "column 2 (integer feature I1) is not an integer: '1.5'"),
    (line(ints=["1"] * 12 + ["abc"]), "column 14 (integer feature I13) is not an integer: 'abc'"),
    (line(ints=["-"] + ["1"] * 12), "column 2 (integer feature I1) is not an integer: '-'"),
    (line(ints=["1-2"] + ["1"] * 12), "is not an integer: '1-2'"),
    (line(ints=["12a"] + ["1"] * 12), "is not an integer: '12a'"),
    (line(ints=["1 "] + ["1"] * 12), "is not an integer: '1 '"),
    (line(ints=["1" * 19] + ["1"] * 12), "has more than 18 digits"),
    (line(cats=["zz"] + ["1"] * 25), "column 15 (categorical feature C1) is not hexadecimal: 'zz'"),
    (line(cats=["1"] * 25 + ["0x12"]), "column 40 (categorical feature C26) is not hexadecimal: '0x12'"),
    (line(cats=["123456789abg"] + ["1"] * 25), "is not hexadecimal: '123456789abg'"),
    (line(cats=["ab\u00e9"] + ["1"] * 25), "is not hexadecimal"),
]


@pytest.mark.parametrize("bad,reason", BROKEN)
def test_each_broken_line_names_file_line_and_reason(tmp_path, bad, reason):
    path = write(tmp_path / "train.txt", [line(), line("0"), bad, line()])
    with pytest.raises(DataFormatError) as err:
        read_all(path)
    assert str(err.value).startswith(f"{path}:3: ")
    assert reason in str(err.value)
    assert (err.value.path, err.value.line) == (str(path), 3)


def test_skip_mode_counts_bad_lines_and_keeps_every_good_one(tmp_path):
    good = [line(str(i % 2), cats=[f"{i:08x}"] * 26) for i in range(30)]
    lines = list(good)
    for k, (bad, _) in enumerate(BROKEN):
        lines.insert(2 * k + 1, bad)
    b, reader = read_all(write(tmp_path / "d.txt", lines), batch_size=7, skip_bad_lines=True, chunk_bytes=300)
    assert reader.bad_lines == len(BROKEN)
    assert len(reader.bad_line_examples) == 5
    assert reader.bad_line_examples[0].startswith(f"{tmp_path / 'd.txt'}:2: expected 40")
    assert b.labels.tolist() == [float(i % 2) for i in range(30)]
    np.testing.assert_array_equal(b.sparse_ids[:, 0], np.arange(30, dtype=np.uint64))


def test_batches_have_exact_size_across_chunks_and_files(tmp_path):
    a = write(tmp_path / "a.txt", [line(cats=[f"{i:x}"] * 26) for i in range(23)])
    b = write(tmp_path / "b.txt", [line(cats=[f"{i:x}"] * 26) for i in range(23, 40)])
    for chunk in (64, 333, 1 << 20):
        batches = list(CriteoReader([a, b], 8, chunk_bytes=chunk))
        assert [len(x) for x in batches] == [8, 8, 8, 8, 8]
        ids = np.concatenate([x.sparse_ids[:, 0] for x in batches])
        np.testing.assert_array_equal(ids, np.arange(40, dtype=np.uint64))


def test_line_numbers_count_per_file_across_chunks(tmp_path):
    a = write(tmp_path / "a.txt", [line()] * 5)
    b = write(tmp_path / "b.txt", [line()] * 57 + ["oops"] + [line()] * 3)
    with pytest.raises(DataFormatError, match=rf"^{b}:58: expected 40"):
        read_all([a, b], chunk_bytes=500)


def test_crlf_missing_final_newline_and_gzip(tmp_path):
    lines = [line("1"), line("0", cats=["abc"] * 26)]
    plain, _ = read_all(write(tmp_path / "unix.txt", lines))
    crlf = tmp_path / "dos.txt"
    crlf.write_bytes("\r\n".join(lines).encode())  # and no newline at the end
    gz = tmp_path / "d.txt.gz"
    with gzip.open(gz, "wt") as f:
        f.write("\n".join(lines) + "\n")
    for other in (crlf, gz):
        got, _ = read_all(other)
        np.testing.assert_array_equal(got.sparse_ids, plain.sparse_ids)
        np.testing.assert_array_equal(got.dense, plain.dense)
        np.testing.assert_array_equal(got.labels, plain.labels)


def test_vectorised_parser_agrees_with_reference_on_mutated_lines(tmp_path):
    rng = random.Random(7)
    alphabet = "0123456789abcdefABCDEF-\t xg.é"
    lines = []
    for i in range(600):
        ints = [rng.choice(["", str(rng.randint(-5, 10**rng.randint(0, 12))), "-1"]) for _ in range(13)]
        cats = [rng.choice(["", f"{rng.getrandbits(32):08x}", f"{rng.getrandbits(12):x}",
                            f"{rng.getrandbits(48):X}"]) for _ in range(26)]
        text = line(str(rng.randint(0, 1)), ints, cats)
        if i % 3 == 0:  # corrupt one character, insert or delete one
            pos = rng.randrange(len(text))
            op = rng.choice(["set", "ins", "del"])
            c = rng.choice(alphabet)
            text = text[:pos] + (c if op != "del" else "") + text[pos + (op != "ins"):]
        lines.append(text)
    path = write(tmp_path / "fuzz.txt", lines)
    got, reader = read_all(path, batch_size=64, skip_bad_lines=True, chunk_bytes=4096)
    expected = [r for r in map(reference, lines) if r is not None]
    assert reader.bad_lines == len(lines) - len(expected) > 50
    assert len(got) == len(expected)
    np.testing.assert_array_equal(got.labels, [e[0] for e in expected])
    np.testing.assert_array_equal(got.dense, np.array([e[1] for e in expected]))
    np.testing.assert_array_equal(got.sparse_ids, np.array([e[2] for e in expected]))


def test_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        CriteoReader(tmp_path / "nope.txt", 10)
    with pytest.raises(ConfigError, match="batch_size=0"):
        CriteoReader(write(tmp_path / "d.txt", [line()]), 0)


def test_criteo_batch_as_tensors_keeps_the_id_bits():
    import torch
    b = CriteoBatch(np.array([1.0], np.float32), np.zeros((1, 13), np.float32),
                    np.array([[2**63 + 5] + [7] * 25], np.uint64))
    t = b.torch()
    assert t["ids"].dtype == torch.int64 and t["ids"][0, 0].item() == -(2**63) + 5
    assert t["ids"].numpy().view(np.uint64)[0, 0] == 2**63 + 5 and t["dense"].shape == (1, 13)
