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
