"""CTR models built from a schema (its num_dense and num_fields), on the batch format of
the tabular reader: ``model(dense [B, D], ids [B, F] | flat ids, offsets [B*F], weights)``
-> logits [B]. Tables come from ``embedding(name, dim)`` (default: paramshard.SparseEmbedding;
``hashed_embedding(buckets)``: tables every trainer holds whole, for collective mode).

    model = build_model("deepfm", schema, dim=16, table_optimizer=ps.optim.Adagrad(lr=0.05))
"""
from __future__ import annotations

import inspect

from paramshard.errors import ConfigError
from paramshard.specs.model_spec import ATTRIBUTE, make_spec
from paramshard.models.autoint import AutoInt
from paramshard.models.dcn import DCN
from paramshard.models.dcnv2 import DCNv2
from paramshard.models.deepfm import DeepFM
from paramshard.models.din import DIN
from paramshard.models.hashed import HashedEmbeddingBag, hashed_embedding
from paramshard.models.lr import LogisticRegression
from paramshard.models.wide_deep import WideDeep
from paramshard.models.xdeepfm import XDeepFM

MODELS = {"lr": LogisticRegression, "widedeep": WideDeep, "deepfm": DeepFM, "dcn": DCN, "dcnv2": DCNv2,
          "xdeepfm": XDeepFM, "autoint": AutoInt, "din": DIN}

__all__ = ["LogisticRegression", "WideDeep", "DeepFM", "DCN", "DCNv2", "XDeepFM", "AutoInt", "DIN", "MODELS", "build_model",
           "build_from_spec", "hashed_embedding", "HashedEmbeddingBag"]

# How a model trains, not what it computes: left out of the recorded spec.
NOT_ARCHITECTURE = ("schema", "embedding", "table_optimizer", "capacity")


def build_model(name: str, schema, **kw):
    """``MODELS[name](schema, **kw)``; ConfigError naming the valid names for any other name.
    The module carries what built it as ``paramshard_spec`` (paramshard/specs/model_spec.py: the
    name, the architecture's arguments with the class's defaults filled in, the schema), so
    a checkpoint or model file can build it again. None is recorded for a model with an
    ``embedding=`` factory of your own (not ``hashed_embedding``: nothing could build its
    tables) or a schema that is not a ``Schema`` (it could not encode data)."""
    key = name.lower() if isinstance(name, str) else name
    cls = MODELS.get(key)
    if cls is None:
        raise ConfigError(f"unknown model {name!r}: choose one of {', '.join(sorted(MODELS))}")
    model = cls(schema, **kw)
    embedding = kw.get("embedding")
    tables = getattr(embedding, ATTRIBUTE, None)       # hashed_embedding's factory says what it makes
    # Only a Schema can be written down (a stand-in with num_dense/num_fields cannot encode data).
    if hasattr(schema, "to_dict") and (embedding is None or tables is not None):
        bound = inspect.signature(cls).bind(schema, **kw)
        bound.apply_defaults()
        args = {k: v for k, v in bound.arguments.items() if k not in NOT_ARCHITECTURE}
        setattr(model, ATTRIBUTE, make_spec(key, args, schema, tables))
    return model


def build_from_spec(spec: dict, embedding=None, classes: dict | None = None):
    """The module a (checked) spec describes, untrained: ``classes`` (name -> class, called
    as ``cls(schema, **args)``, or ``cls(**args)`` when the spec has no schema) are looked
    up first, then paramshard's MODELS. ``embedding``: the tables' factory (default: the
    spec's hashed tables, else SparseEmbedding modules)."""
    from paramshard.specs.schema import Schema

    cls = (classes or {}).get(spec["model"]) or MODELS.get(spec["model"])
    if cls is None:
        raise ConfigError(f"the recorded model {spec['model']!r} is not one paramshard builds "
                          f"({', '.join(sorted(MODELS))}): pass its class, classes={{{spec['model']!r}: "
                          f"YourModel}}, or build the module and pass it")
    args = dict(spec["args"])
    if embedding is None and "embedding" in spec:
        embedding = hashed_embedding(spec["embedding"]["buckets"], spec["embedding"]["init_scale"])
    if embedding is not None:
        args["embedding"] = embedding
    if spec.get("schema") is None:
        return cls(**args)
    schema = Schema.from_dict(spec["schema"], where="the recorded schema")
    try:
        model = cls(schema, **args)
    except TypeError as exc:        # arguments this version's class does not take
        raise ConfigError(f"the recorded model {spec['model']!r} cannot be built with {sorted(spec['args'])}: "
                          f"{exc}") from None
    if cls is MODELS.get(spec["model"]):
        setattr(model, ATTRIBUTE, spec)
    return model
