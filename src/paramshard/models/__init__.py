"""CTR models built from a schema (its num_dense and num_fields), on the batch format of
the tabular reader: ``model(dense [B, D], ids [B, F] | flat ids, offsets [B*F], weights)``
-> logits [B]. Tables come from ``embedding(name, dim)`` (default: paramshard.SparseEmbedding;
``hashed_embedding(buckets)``: tables every trainer holds whole, for collective mode).

    model = build_model("deepfm", schema, dim=16, table_optimizer=ps.optim.Adagrad(lr=0.05))
"""
from __future__ import annotations

from ..errors import ConfigError
from .dcn import DCN
from .deepfm import DeepFM
from .hashed import HashedEmbeddingBag, hashed_embedding
from .lr import LogisticRegression
from .wide_deep import WideDeep

MODELS = {"lr": LogisticRegression, "widedeep": WideDeep, "deepfm": DeepFM, "dcn": DCN}

__all__ = ["LogisticRegression", "WideDeep", "DeepFM", "DCN", "MODELS", "build_model", "hashed_embedding",
           "HashedEmbeddingBag"]


def build_model(name: str, schema, **kw):
    """``MODELS[name](schema, **kw)``; ConfigError naming the valid names for any other name."""
    cls = MODELS.get(name.lower() if isinstance(name, str) else name)
    if cls is None:
        raise ConfigError(f"unknown model {name!r}: choose one of {', '.join(sorted(MODELS))}")
    return cls(schema, **kw)
