"""What model was trained, as data: enough to build the module again without the script.

``paramshard.models.build_model`` attaches one to the module it builds, as
``module.paramshard_spec``; a module of your own may declare one too:

    {"model": "deepfm",                              # a name of paramshard.models.MODELS (or your own)
     "args": {"dim": 8, "hidden": [128, 64], "prefix": ""},   # the architecture's arguments, defaults filled in
     "schema": {...},                                # the fitted schema (Schema.to_dict()), or absent
     "embedding": {"kind": "hashed", "buckets": 65536, "init_scale": 0.01}}   # only for hashed tables

The Trainer's chief writes it into every checkpoint's manifest ("model"), and
``export_model`` / ``snapshot_model`` copy it into the model file ("spec"), from
which ``paramshard.inference.serving.build_from_file`` builds the module and ``paramshard
predict`` encodes data. Only architecture arguments: optimizers, capacities and
embedding factories are how a model trains, not what it computes.

A spec comes from disk (a manifest, a model file someone sent): ``check_spec``
validates it before any of it is used. It is plain JSON: nothing in it is imported
or run (a class is looked up by name among the ones the caller allows).
"""
from __future__ import annotations

import json

ATTRIBUTE = "paramshard_spec"
KEYS = ("model", "args", "schema", "embedding")
# An architecture argument's list (hidden widths, cross layers) is a few numbers: one of a
# million entries would make a million layers before any size could be compared to the file's.
MAX_ARG_ITEMS = 4096
EMBEDDING_KINDS = ("hashed",)


class SpecError(ValueError):
    """A recorded spec that does not follow the format; worded to follow "WHERE: "."""


def plain(value):
    """``value`` as JSON types: tuples become lists, numpy scalars Python numbers."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if hasattr(value, "item") and callable(value.item):      # a numpy or torch scalar
        return value.item()
    return value


def make_spec(model: str, args: dict, schema=None, embedding: dict | None = None) -> dict:
    """A spec from its parts (``schema``: a Schema, a dict or None), checked to be JSON."""
    spec = {"model": model, "args": plain(args)}
    if schema is not None:
        spec["schema"] = schema if isinstance(schema, dict) else schema.to_dict()
    if embedding is not None:
        spec["embedding"] = plain(embedding)
    json.dumps(spec)        # TypeError now, not when a checkpoint is written
    return check_spec(spec)


def spec_of(module) -> dict | None:
    """The module's declared spec (checked), or None when it declares none."""
    spec = getattr(module, ATTRIBUTE, None)
    if spec is None:
        return None
    try:
        json.dumps(spec)
        return check_spec(spec)
    except (TypeError, ValueError) as exc:
        from paramshard.errors import ConfigError
        raise ConfigError(f"{type(module).__name__}.{ATTRIBUTE}: {exc} (a JSON object: "
                          f"{{'model': NAME, 'args': {{...}}, 'schema': {{...}} (optional)}})") from None


def check_spec(spec) -> dict:
    """``spec`` when it follows the format above; SpecError naming the field otherwise."""
    if not isinstance(spec, dict):
        raise SpecError(f"the model spec must be an object, got {type(spec).__name__}")
    unknown = sorted(set(spec) - set(KEYS), key=str)
    if unknown:
        raise SpecError(f"the model spec has an unknown key {unknown[0]!r} (known: {', '.join(KEYS)})")
    if not isinstance(spec.get("model"), str) or not spec["model"]:
        raise SpecError(f"the model spec's 'model' must be a non-empty name, got {spec.get('model')!r:.60}")
    if not isinstance(spec.get("args"), dict) or not all(isinstance(k, str) for k in spec["args"]):
        raise SpecError("the model spec's 'args' must be an object of argument names")
    for name, value in spec["args"].items():
        if isinstance(value, (list, dict)) and len(value) > MAX_ARG_ITEMS:
            raise SpecError(f"the model spec's args.{name} has {len(value)} entries (at most {MAX_ARG_ITEMS}: "
                            f"an architecture's arguments are a few numbers)")
    if spec.get("schema") is not None:
        from paramshard.specs.schema import Schema      # no pandas: schema.py is plain dataclasses
        from paramshard.errors import ConfigError
        try:
            Schema.from_dict(spec["schema"], where="the model spec's schema")
        except ConfigError as exc:
            raise SpecError(str(exc)) from None
    if "embedding" in spec:
        _check_embedding(spec["embedding"])
    return spec


def _check_embedding(embedding) -> None:
    if not isinstance(embedding, dict) or embedding.get("kind") not in EMBEDDING_KINDS:
        raise SpecError(f"the model spec's 'embedding' must be an object with kind one of {EMBEDDING_KINDS}")
    buckets, scale = embedding.get("buckets"), embedding.get("init_scale")
    if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 1 or buckets & (buckets - 1):
        raise SpecError(f"the model spec's hashed tables: buckets must be a power of two, got {buckets!r:.60}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 <= scale < float("inf"):
        raise SpecError(f"the model spec's hashed tables: init_scale must be a number >= 0, got {scale!r:.60}")
