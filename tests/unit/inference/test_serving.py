"""inference/serving.py's local tables: an id without a row reads what the servers would give it in
evaluation, rounded to the table's row format (a model file without one: float32)."""
import numpy as np
import pytest
import torch

from paramshard.placement.sparse_hash import initial_rows
from paramshard.inference.serving import LocalTable, _table


def file_entry(**extra):
    return {"ids": torch.tensor([3], dtype=torch.int64), "rows": torch.ones((1, 4)), "dim": 4, "seed": 2,
            "init_scale": 0.5, "admission": {"min_count": 1, "probability": 1.0}, **extra}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_unknown_ids_read_their_initial_row_in_the_tables_format(dtype):
    table = _table("t", file_entry(dtype=dtype))
    assert table.dtype == dtype
    ids = np.array([3, 11, 12], np.uint64)
    got = table.lookup(ids)
    fresh = torch.from_numpy(initial_rows(2, ids[1:], 4, 0.5))
    expected = fresh.to(getattr(torch, dtype)).to(torch.float32).numpy()
    np.testing.assert_array_equal(got[1:], expected)
    assert (got[0] == 1).all()
    assert (dtype == "float32") == np.array_equal(got[1:], fresh.numpy())


def test_a_model_file_without_a_row_format_is_float32_and_a_bad_one_is_refused():
    assert _table("t", file_entry()).dtype == "float32"
    assert LocalTable("t", np.zeros(0, np.uint64), np.zeros((0, 4), np.float32), 0, 0.1).dtype == "float32"
    with pytest.raises(ValueError, match="rows stored as 'float8'"):
        _table("t", file_entry(dtype="float8"))
