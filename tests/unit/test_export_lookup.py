"""ExportedTable.lookup takes the ids the model takes; exports are written atomically."""
import numpy as np
import pytest
import torch

from paramshard.errors import ConfigError
from paramshard.export import ExportedTable, load_table, replaced_into_place, save_table
from paramshard.placement.sparse_hash import initial_rows

DIM = 4
BIG = np.uint64(2**64 - 1)          # the int64 id -1 as the model sees it


def table() -> ExportedTable:
    ids = np.array([1, 5, 9, BIG], np.uint64)
    values = np.arange(4 * DIM, dtype=np.float32).reshape(4, DIM) + 100
    return ExportedTable("t", ids, values, seed=3, init_scale=0.01)


def expected(t: ExportedTable, ids_u64: np.ndarray) -> np.ndarray:
    """Row by row, the slow way."""
    out = []
    for i in ids_u64.reshape(-1):
        hit = np.flatnonzero(t.ids == i)
        out.append(t.values[hit[0]] if len(hit) else initial_rows(t.seed, np.array([i], np.uint64), DIM,
                                                                   t.init_scale)[0])
    return np.array(out, np.float32).reshape(ids_u64.shape + (DIM,))


@pytest.mark.parametrize("shape", [(6,), (2, 3), (2, 1, 3), (0, 3)])
def test_nd_ids_give_ids_shape_plus_dim(shape):
    t = table()
    n = int(np.prod(shape))
    ids = np.array([1, 2, 5, -1, 9, 7] * 2, np.int64)[:n].reshape(shape)
    want = expected(t, ids.view(np.uint64))
    for given in (ids, ids.view(np.uint64), torch.from_numpy(ids.copy())):
        got = t.lookup(given)
        assert got.shape == shape + (DIM,) and got.dtype == np.float32
        np.testing.assert_array_equal(got, want)


def test_int64_ids_are_uint64_bit_patterns_like_the_model():
    from paramshard.trainer.sparse_embedding import as_uint64
    t = table()
    ids = torch.tensor([[-1, 5], [1, -2]])
    np.testing.assert_array_equal(t.lookup(ids), t.lookup(as_uint64(ids)))
    np.testing.assert_array_equal(t.lookup(ids)[0, 0], t.values[3])     # -1 is the stored 2**64-1


def test_unknown_ids_zeros_or_initial_and_scalars_and_lists():
    t = table()
    assert t.lookup(5).shape == (DIM,)
    np.testing.assert_array_equal(t.lookup([[5, 2]], unknown="zeros")[0, 1], np.zeros(DIM, np.float32))
    np.testing.assert_array_equal(t.lookup([[5, 2]])[0, 1], initial_rows(3, np.array([2], np.uint64), DIM, 0.01)[0])
    assert t.lookup([]).shape == (0, DIM)
    empty = ExportedTable("e", np.zeros(0, np.uint64), np.zeros((0, DIM), np.float32), 3, 0.01)
    assert empty.lookup(np.ones((2, 2), np.int64), unknown="zeros").shape == (2, 2, DIM)
    with pytest.raises(ConfigError, match="integers"):
        t.lookup(np.array([1.5]))
    with pytest.raises(ConfigError, match="unknown="):
        t.lookup([1], unknown="nan")


def test_save_is_atomic_and_round_trips(tmp_path):
    t = table()
    meta = {"name": "t", "dim": DIM, "seed": 3, "init_scale": 0.01}
    path = tmp_path / "t.npz"
    save_table(path, meta, t.ids, t.values)
    save_table(path, meta, t.ids, t.values)          # over an existing file
    back = load_table(path)
    np.testing.assert_array_equal(back.lookup([[1, 9]]), t.lookup([[1, 9]]))
    assert [p.name for p in tmp_path.iterdir()] == ["t.npz"]       # no temporary left behind


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        with replaced_into_place(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("interrupted")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]
