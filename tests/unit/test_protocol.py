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
