import msgpack
import numpy as np
import pytest

from paramshard.errors import ProtocolError
from paramshard.transport import protocol


def test_arrays_round_trip_without_copies():
    a = np.arange(10, dtype=np.float32)
    b = np.arange(6, dtype=np.uint64).reshape(2, 3)
    frames = protocol.encode({"op": "push_dense", "id": 5}, [a, b])
    header = protocol.decode_header(bytes(frames[0]))
    out = protocol.decode_arrays(header, frames[1:])
    np.testing.assert_array_equal(out[0], a)
    np.testing.assert_array_equal(out[1], b)
    assert np.shares_memory(out[0], a)   # views over the sent buffer, no copy


def test_pickle_and_objects_cannot_travel():
    with pytest.raises(ProtocolError, match="cannot travel"):
        protocol.encode({"op": "x", "id": 1}, [np.array(["a"], dtype=object)])


def test_header_limits():
    with pytest.raises(ProtocolError, match="more than"):
        protocol.decode_header(b"\x80" * (protocol.MAX_HEADER_BYTES + 1))
    with pytest.raises(ProtocolError, match="request 'id'"):
        protocol.decode_header(msgpack.packb({"v": 1, "arrays": []}))
    with pytest.raises(ProtocolError, match="frames but"):
        protocol.decode_arrays({"arrays": [{"dtype": "float32", "shape": [1]}]}, [])


def _raw(**fields):
    return msgpack.packb({"v": protocol.PROTOCOL_VERSION, "id": 9, "arrays": [], **fields})


@pytest.mark.parametrize("fields,expected", [
    ({"v": True}, "protocol version True"),     # bool is an int subclass and True == 1
    ({"v": 1.0}, "protocol version 1.0"),       # 1.0 == 1
    ({"v": "1"}, "protocol version '1'"),
    ({"id": True}, "request 'id'"),
    ({"id": 9.0}, "request 'id'"),
])
def test_version_and_id_must_be_true_integers(fields, expected):
    with pytest.raises(ProtocolError, match=expected):
        protocol.decode_header(_raw(**fields))


def test_a_plain_header_still_decodes():
    assert protocol.decode_header(_raw(op="hello"))["id"] == 9


def _request(op, **fields):
    header = protocol.decode_header(_raw(op=op, **fields))
    protocol.validate_request(header)
    return header


PULL = {"table": "t", "trainer": 0, "min_version": 0}
PUSH = {"table": "t", "step": 0, "trainer": 0}


def test_optional_fields_may_be_absent_or_bool():
    _request("pull_sparse", **PULL)
    _request("pull_sparse", **PULL, create=False)
    _request("pull_sparse", **PULL, create=True)
    _request("push_sparse", **PUSH)
    _request("push_sparse", **PUSH, distinct=True)


@pytest.mark.parametrize("op,fields,expected", [
    ("pull_sparse", {**PULL, "create": 0}, "field 'create' must be bool, got int"),
    ("pull_sparse", {**PULL, "create": "no"}, "field 'create' must be bool, got str"),
    ("pull_sparse", {**PULL, "create": None}, "field 'create' must be bool, got NoneType"),
    ("push_sparse", {**PUSH, "distinct": 1}, "field 'distinct' must be bool, got int"),
    ("push_dense", {"names": ["w"], "step": 0, "trainer": 0, "reply_values": 1},
     "field 'reply_values' must be bool, got int"),
    ("push_sparse", {**PUSH, "step": True}, "field 'step' must be int, got bool"),
    ("pull_sparse", {**PULL, "trainer": 1.0}, "field 'trainer' must be int, got float"),
])
def test_field_types_are_exact(op, fields, expected):
    with pytest.raises(ProtocolError, match=expected):
        _request(op, **fields)


def test_a_missing_required_field_is_still_named():
    with pytest.raises(ProtocolError, match="pull_sparse: missing field 'min_version'"):
        _request("pull_sparse", table="t", trainer=0, create=True)


@pytest.mark.parametrize("raw,expected", [
    (_raw(op="hello"), 9),
    (_raw(v=99, op="hello"), 9),                       # bad version: the id is still readable
    (_raw(op="explode"), 9),                           # unknown op
    (_raw(op="pull_sparse", table=3), 9),              # fails validation later
    (msgpack.packb({"id": 12, "v": True}), 12),        # no arrays, bad v
    (msgpack.packb({"id": True, "v": 1, "arrays": []}), -1),
    (msgpack.packb({"id": 1.5, "v": 1, "arrays": []}), -1),
    (msgpack.packb({"v": 1, "arrays": []}), -1),
    (msgpack.packb([1, 2, 3]), -1),
    (b"\xc1garbage", -1),
    (b"", -1),
    (b"\x80" * (protocol.MAX_HEADER_BYTES + 1), -1),
], ids=["valid", "bad-version", "unknown-op", "bad-field", "no-arrays", "bool-id", "float-id", "no-id",
        "not-a-map", "not-msgpack", "empty", "oversized"])
def test_request_id_of_reads_the_id_whenever_it_can(raw, expected):
    assert protocol.request_id_of(raw) == expected
    assert protocol.request_id_of(memoryview(raw)) == expected


@pytest.mark.parametrize("meta,frame,expected", [
    ({"dtype": ["float32"], "shape": [1]}, b"\0" * 4, "dtype must be one of"),     # unhashable
    ({"dtype": {"a": 1}, "shape": [1]}, b"\0" * 4, "dtype must be one of"),
    ({"dtype": "float32", "shape": [True, True]}, b"\0" * 4, "shape must be a list of non-negative ints"),
    ({"dtype": "float32", "shape": [1.0]}, b"\0" * 4, "shape must be a list of non-negative ints"),
    ({"dtype": "float32", "shape": [-1]}, b"", "shape must be a list of non-negative ints"),
    ({"dtype": "uint64", "shape": [0, 2 ** 64 - 1]}, b"", "too large"),
    ({"dtype": "float32", "shape": [0, 2 ** 40, 2 ** 40]}, b"", "too large"),
    ({"dtype": "float32", "shape": [1] * 33}, b"\0" * 4, "dimensions"),
], ids=["dtype-list", "dtype-map", "shape-bools", "shape-float", "shape-negative", "dim-2^64",
        "empty-but-huge", "too-many-dims"])
def test_bad_array_metadata_is_a_protocol_error(meta, frame, expected):
    with pytest.raises(ProtocolError, match=expected):
        protocol.decode_arrays({"arrays": [meta]}, [frame])


def test_empty_arrays_with_a_shape_still_decode():
    out = protocol.decode_arrays({"arrays": [{"dtype": "float32", "shape": [0, 8]}]}, [b""])
    assert out[0].shape == (0, 8)


BARRIER = {"trainer": 0, "name": "epoch", "count": 1}


@pytest.mark.parametrize("fields,expected", [
    ({k: v for k, v in BARRIER.items() if k != "name"}, "barrier: missing field 'name'"),
    ({k: v for k, v in BARRIER.items() if k != "count"}, "barrier: missing field 'count'"),
    ({k: v for k, v in BARRIER.items() if k != "trainer"}, "barrier: missing field 'trainer'"),
    ({**BARRIER, "name": ["epoch"]}, "field 'name' must be str, got list"),
    ({**BARRIER, "count": True}, "field 'count' must be int, got bool"),
    ({**BARRIER, "count": 1.0}, "field 'count' must be int, got float"),
    ({**BARRIER, "trainer": None}, "field 'trainer' must be int, got NoneType"),
])
def test_barrier_fields_are_checked(fields, expected):
    _request("barrier", **BARRIER)
    with pytest.raises(ProtocolError, match=expected):
        _request("barrier", **fields)


def test_a_table_registration_may_name_its_row_format():
    register = {"table": "t", "dim": 4, "seed": 0, "optimizer": {}, "policy": {}, "trainer": 0}
    _request("register_sparse", **register)
    _request("register_sparse", **register, dtype="bfloat16", rounding="stochastic")
    with pytest.raises(ProtocolError, match="field 'dtype' must be one of float32, float16, bfloat16, got 'half'"):
        _request("register_sparse", **register, dtype="half")
    with pytest.raises(ProtocolError, match="field 'rounding' must be one of nearest, stochastic, got 1"):
        _request("register_sparse", **register, rounding=1)
