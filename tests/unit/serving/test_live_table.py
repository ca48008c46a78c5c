"""serving/live_table.py: a table copy answers every lookup as serving.LocalTable (the model file's
table) with the same rows and settings: held rows, unknown ids' initial rows in the row format,
admission by probability, zeros under min_count or unknown="zeros"."""
import numpy as np
import pytest

from paramshard.inference.serving import LocalTable
from paramshard.server.storage.row_formats import rounded
from paramshard.serving.live_table import StoreChoice, TableCopy, TableSettings


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("min_count, probability", [(1, 1.0), (1, 0.5), (3, 1.0)])
def test_lookups_equal_local_tables(dtype, min_count, probability):
    g = np.random.default_rng(0)
    ids = np.sort(g.choice(1000, 300, replace=False).astype(np.uint64))
    # Rows as the servers hold them: already in the row format, so both sides hold the same values.
    rows = rounded(g.standard_normal((len(ids), 8)).astype(np.float32), dtype)
    settings = TableSettings("t", 8, 7, 0.05, min_count, probability, dtype)
    local = LocalTable("t", ids, rows, 7, 0.05, min_count, probability, dtype)
    copy = TableCopy(settings, StoreChoice("numpy"))
    copy.upsert(ids[::-1], rows[::-1])            # any order
    query = np.concatenate([ids[:50], np.arange(2000, 2100, dtype=np.uint64), ids[-3:], ids[:2]])
    for unknown in ("initial", "zeros"):
        np.testing.assert_array_equal(copy.lookup(query, unknown), local.lookup(query, unknown))
    copy.remove(ids[:10])
    local = LocalTable("t", ids[10:], rows[10:], 7, 0.05, min_count, probability, dtype)
    np.testing.assert_array_equal(copy.lookup(query), local.lookup(query))
    assert copy.num_rows == 290
