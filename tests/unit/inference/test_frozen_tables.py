"""inference/frozen_tables.py: a model file's tables in tensor operations give exactly what
serving.LocalTable (`paramshard predict`'s tables) and nn.EmbeddingBag give: the same rows for
stored ids, the same initial rows (or zeros) for unseen ones, the same pooling."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from paramshard.inference.frozen_tables import FrozenHashedTable, FrozenTable, lower_bound, mix64, pool
from paramshard.inference.serving import LocalTable
from paramshard.models.hashed import HashedEmbeddingBag
from paramshard.placement import sparse_hash


def uint64s(rng, n):
    return rng.integers(0, 2 ** 64, n, dtype=np.uint64, endpoint=False)


def test_mix64_has_the_bits_of_the_uint64_hash():
    x = uint64s(np.random.default_rng(0), 500)
    got = mix64(torch.from_numpy(x.view(np.int64))).numpy().view(np.uint64)
    np.testing.assert_array_equal(got, sparse_hash.mix64(x))


@pytest.mark.parametrize("n", [1, 2, 5, 8, 33])
def test_lower_bound_is_searchsorted(n):
    rng = np.random.default_rng(n)
    keys = np.sort(uint64s(rng, n).view(np.int64))
    x = np.concatenate([keys, keys - 1, keys + 1, [np.iinfo(np.int64).min, np.iinfo(np.int64).max]])
    got = lower_bound(torch.from_numpy(keys), torch.from_numpy(x), n).numpy()
    np.testing.assert_array_equal(got, np.searchsorted(keys, x, side="left"))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("min_count, probability", [(1, 1.0), (1, 0.5), (3, 1.0)])
def test_rows_are_the_local_tables_for_stored_and_unseen_ids(dtype, min_count, probability):
    rng = np.random.default_rng(7)
    ids = np.unique(uint64s(rng, 40))          # the high bit set in about half: negative as int64
    table = LocalTable("t", ids, rng.normal(size=(len(ids), 5)).astype(np.float32), seed=11, init_scale=0.05,
                       min_count=min_count, probability=probability, dtype=dtype)
    asked = np.concatenate([ids[::2], uint64s(rng, 60)])
    frozen = FrozenTable(table)
    got = frozen(torch.from_numpy(asked.view(np.int64)).view(-1, 1)).numpy()
    expected = table.lookup(asked)
    np.testing.assert_array_equal(got, expected)
    unseen = expected[len(ids[::2]):]
    if min_count == 1:      # the case where the initial rows matter: some are not zero
        assert (unseen != 0).any(axis=1).sum() >= (30 if probability == 1.0 else 10)
    zeros = FrozenTable(table, unknown="zeros")(torch.from_numpy(asked.view(np.int64)).view(-1, 1)).numpy()
    np.testing.assert_array_equal(zeros, table.lookup(asked, unknown="zeros"))


def test_an_empty_table_reads_initial_rows():
    table = LocalTable("t", np.zeros(0, np.uint64), np.zeros((0, 3), np.float32), seed=2, init_scale=0.1)
    asked = np.array([0, 5, 2 ** 63 + 1], np.uint64)
    got = FrozenTable(table)(torch.from_numpy(asked.view(np.int64)).view(-1, 1)).numpy()
    np.testing.assert_array_equal(got, table.lookup(asked))


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_bags_pool_as_embedding_bag_does_empty_bags_included(mode):
    rng = np.random.default_rng(3)
    rows = torch.from_numpy(rng.normal(size=(20, 4)).astype(np.float32))
    lengths = np.array([2, 0, 1, 3, 0, 0, 4, 0])            # empty bags in the middle and at the end
    index = torch.from_numpy(rng.integers(0, 20, lengths.sum()))
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]))
    weights = torch.from_numpy(rng.random(lengths.sum()).astype(np.float32)) if mode == "sum" else None
    got = pool(rows[index], index, offsets, weights, mode)
    expected = F.embedding_bag(index, rows, offsets, mode=mode, per_sample_weights=weights)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    grid = index[:6].view(3, 2)                              # [n, bag] without offsets
    torch.testing.assert_close(pool(rows[grid], grid, None, None, mode), F.embedding_bag(grid, rows, mode=mode),
                               rtol=0, atol=1e-6)


def test_hashed_tables_hash_ids_to_the_same_buckets():
    table = HashedEmbeddingBag("deep", 16, 3)
    ids = torch.from_numpy(uint64s(np.random.default_rng(1), 12).view(np.int64))
    frozen = FrozenHashedTable(table)
    torch.testing.assert_close(frozen(ids.view(-1, 2)), table(ids.view(-1, 2)), rtol=0, atol=0)
    offsets = torch.tensor([0, 5, 5, 9])
    torch.testing.assert_close(frozen(ids, offsets), table(ids, offsets), rtol=0, atol=1e-6)
