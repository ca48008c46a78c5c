"""Hashed tables (models/hashed.py): a CTR model's tables as ordinary dense modules."""
import numpy as np
import pytest
import torch

from paramshard.errors import ConfigError
from paramshard.models import WideDeep, hashed_embedding
from paramshard.models.hashed import HashedEmbeddingBag
from paramshard.placement.sparse_hash import initial_rows


class Schema:
    num_dense, num_fields = 3, 4


def test_rows_are_a_stable_hash_per_table_and_start_like_sparse_rows():
    a, b = HashedEmbeddingBag("wide", 1024, 4), HashedEmbeddingBag("deep", 1024, 4)
    ids = torch.tensor([0, 1, 2, -5, 2**62], dtype=torch.int64)
    rows = a.rows_of(ids)
    assert rows.min() >= 0 and rows.max() < 1024
    assert torch.equal(rows, HashedEmbeddingBag("wide", 1024, 4).rows_of(ids))     # stable
    assert not torch.equal(rows, b.rows_of(ids))                                    # salted per table
    np.testing.assert_array_equal(a.weight.detach().numpy()[:3],
                                  initial_rows(int(a.salt), np.arange(3, dtype=np.uint64), 4, 0.01))


def test_a_lookup_is_the_embedding_bag_of_the_hashed_rows():
    table = HashedEmbeddingBag("t", 64, 3)
    ids = torch.tensor([[7], [9], [7]])
    want = table.weight[table.rows_of(ids).view(-1)]
    torch.testing.assert_close(table(ids), want)


def test_a_model_with_hashed_tables_has_only_dense_parameters_and_trains():
    model = WideDeep(Schema(), dim=4, hidden=(8,), embedding=hashed_embedding(256))
    names = {n for n, _ in model.named_parameters()}
    assert {"wide.weight", "deep.weight"} <= names
    dense, ids = torch.randn(5, 3), torch.randint(0, 10**9, (5, 4))
    loss = model(dense, ids).sum()
    loss.backward()
    assert model.deep.weight.grad.abs().sum() > 0


def test_buckets_must_be_a_power_of_two():
    with pytest.raises(ConfigError, match="power of two"):
        HashedEmbeddingBag("t", 1000, 4)
