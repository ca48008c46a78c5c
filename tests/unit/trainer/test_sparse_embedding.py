"""trainer/sparse_embedding.py's table settings: which row formats a SparseEmbedding may ask for, and
how they reach the servers' registration."""
import pytest
import torch

import paramshard as ps
from paramshard.client.sparse import SparseClient, TableSpec
from paramshard.errors import ConfigError


@pytest.mark.parametrize("dtype, stochastic, expected", [
    (torch.float32, False, ("float32", "nearest")),
    (torch.float16, False, ("float16", "nearest")),
    (torch.bfloat16, True, ("bfloat16", "stochastic")),
    (torch.float16, True, ("float16", "stochastic")),
])
def test_a_row_format_becomes_the_tables_spec(dtype, stochastic, expected):
    emb = ps.SparseEmbedding("e", 4, dtype=dtype, stochastic_rounding=stochastic)
    assert (emb.spec.dtype, emb.spec.rounding) == expected
    assert ("dtype=" in repr(emb)) == (dtype != torch.float32)


@pytest.mark.parametrize("kwargs, needle", [
    ({"dtype": torch.float64}, "dtype must be torch.float32, torch.float16 or torch.bfloat16"),
    ({"dtype": "float16"}, "dtype must be torch.float32, torch.float16 or torch.bfloat16"),
    ({"dtype": torch.int8}, "got torch.int8"),
    ({"dtype": torch.float16, "stochastic_rounding": 1}, "stochastic_rounding must be True or False"),
    ({"stochastic_rounding": True}, "float32 rows are never rounded"),
])
def test_other_row_formats_are_refused_where_declared(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        ps.SparseEmbedding("e", 4, **kwargs)


def test_the_registration_carries_the_row_format():
    sent = []

    class Links:
        def __len__(self):
            return 2

        def request_many(self, requests):
            sent.extend(header for header, _ in requests.values())

    SparseClient(Links(), 0).register_sparse(ps.SparseEmbedding("e", 4, dtype=torch.bfloat16).spec)
    assert [(h["dtype"], h["rounding"]) for h in sent] == [("bfloat16", "nearest")] * 2
    with pytest.raises(ConfigError, match="rows are stored as one of"):
        TableSpec("e", 4, ps.optim.SGD(), dtype="float8")


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_constant_rows_in_bags_of_one_id_equal_the_embedding_bag_path(mode):
    """A served model's table (rows attached as constants) given bags of one id each returns each
    id's row as read, duplicates included: equal to the pooled rows of the training path."""
    import numpy as np
    from paramshard.trainer.sparse_embedding import SparseEmbedding
    g = np.random.default_rng(0)
    values = g.standard_normal((50, 4)).astype(np.float32)
    values[3] = -0.0
    source = lambda ids, training: values[ids.astype(np.int64) % 50]        # noqa: E731 - a fresh array per call
    ids = torch.from_numpy(g.integers(0, 200, (300, 1)))                   # repeated ids
    served, reference = SparseEmbedding("t", 4, mode=mode), SparseEmbedding("t", 4, mode=mode)
    served.attach(source, trainable=False)
    reference.attach(source, trainable=True)
    a, b = served.eval()(ids), reference.eval()(ids)
    assert a.shape == b.shape == (300, 4) and torch.equal(a, b)
    bags = torch.from_numpy(g.integers(0, 200, (30, 3)))                     # bags of 3: pooled, as before
    assert torch.equal(served(bags), reference(bags))
