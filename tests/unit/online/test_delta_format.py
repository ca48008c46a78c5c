"""The delta file: what is written is read back bit for bit, and nothing damaged gets past the checks."""
import json
import struct

import numpy as np
import pytest

from paramshard.online.delta_format import (MAGIC, Delta, DeltaError, TableChange, decode, encode,
                                            read_delta)


def a_delta(kind="delta", dtype=np.float32, rows=5, dim=4):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 2**63, rows, dtype=np.uint64) | np.uint64(1 << 63)   # high bit set: uint64, not int64
    tombstones = np.array([] if kind == "snapshot" else [7, 9], np.uint64)
    tables = {"deep": TableChange(ids, rng.standard_normal((rows, dim)).astype(dtype), tombstones, version=12),
              "wide": TableChange(np.array([], np.uint64), np.zeros((0, 1), dtype), np.array([], np.uint64))}
    dense = {"mlp.0.weight.block0": rng.standard_normal(10).astype(np.float32)}
    return Delta(kind, server=1, seq=3, step=40, created=1764412345.25, tables=tables, dense=dense)


@pytest.mark.parametrize("kind", ["delta", "snapshot"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_delta_reads_back_exactly(kind, dtype):
    written = a_delta(kind, dtype)
    read = decode(encode(written))
    assert (read.kind, read.server, read.seq, read.step, read.created) == (kind, 1, 3, 40, 1764412345.25)
    assert read.tables.keys() == written.tables.keys()
    for name, change in written.tables.items():
        got = read.tables[name]
        assert got.values.dtype == dtype and got.values.shape == change.values.shape
        assert np.array_equal(got.ids, change.ids) and np.array_equal(got.tombstones, change.tombstones)
        assert np.array_equal(got.values, change.values) and got.version == change.version
    assert np.array_equal(read.dense["mlp.0.weight.block0"], written.dense["mlp.0.weight.block0"])


def test_its_size_is_its_rows_plus_a_header():
    rows, dim = 10_000, 16
    delta = a_delta(rows=rows, dim=dim)
    size = len(encode(delta))
    row_bytes = rows * (8 + dim * 4)
    assert row_bytes < size <= 1.1 * row_bytes + 4096


def test_a_snapshot_with_tombstones_is_refused_at_write():
    delta = a_delta("snapshot")
    delta.tables["deep"].tombstones = np.array([1], np.uint64)
    with pytest.raises(ValueError, match="snapshot holds no tombstones"):
        encode(delta)


def header_and_payload(data: bytes):
    (n,) = struct.unpack_from("<I", data, len(MAGIC))
    start = len(MAGIC) + 4
    return json.loads(data[start:start + n]), data[start + n:]


def rebuilt(header, payload: bytes) -> bytes:
    head = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(head)) + head + payload


def test_every_kind_of_damage_is_one_delta_error_naming_it():
    good = encode(a_delta())
    header, payload = header_and_payload(good)
    cases = {
        "not a paramshard delta": b"PK\x03\x04" + good[4:],
        "format version": good[:len(MAGIC) - 1] + b"9" + good[len(MAGIC):],
        "does not fit the file": good[:len(MAGIC)] + struct.pack("<I", 1 << 30) + good[len(MAGIC) + 4:],
        "truncated or appended": good[:-1],
        "checksum differs": good[:-1] + bytes([good[-1] ^ 1]),
        "past the payload": rebuilt({**header, "arrays": [{**header["arrays"][0], "offset": len(payload)}]
                                     + header["arrays"][1:]}, payload),
        "dtype": rebuilt({**header, "arrays": [{**header["arrays"][0], "dtype": "|O"}] + header["arrays"][1:]},
                         payload),
        "do not match its header": rebuilt({**header, "tables": {**header["tables"], "deep": {
            **header["tables"]["deep"], "rows": 4}}}, payload),
        "must be an integer": rebuilt({**header, "seq": -1}, payload),
        "kind": rebuilt({**header, "kind": "patch"}, payload),
    }
    for reason, data in cases.items():
        with pytest.raises(DeltaError, match=reason):
            decode(data, "d.psd")


def test_read_delta_names_a_missing_file(tmp_path):
    with pytest.raises(DeltaError, match="cannot read"):
        read_delta(tmp_path / "delta-0000000001.psd")
