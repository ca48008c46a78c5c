"""A delta directory made in the test (online/delta_log.py DeltaLog.publish), from known tables: a
small DeepFM's model.pt (its spec and fitted-free schema: no fitting, no training) and blocks.json."""
from __future__ import annotations

import json
import time

import numpy as np
import torch

from paramshard.data import Column, Label, Schema
from paramshard.inference.serving import model_dict, sparse_entry, write_model_file
from paramshard.models import build_model
from paramshard.online.delta_format import Delta, TableChange
from paramshard.online.delta_log import DeltaLog
from paramshard.specs.model_spec import spec_of
from paramshard.tables import Admission
from paramshard.trainer.sparse_embedding import tables_of

SCHEMA = Schema(Label("click"), [Column("price", transforms=["log"]), Column("city", "categorical"),
                                 Column("tags", "multi")])
DIMS = {"wide": 1, "deep": 4}


def make_model_dir(root, dtype: str = "float32", schema: Schema = SCHEMA):
    """root/model.pt (no rows) and root/blocks.json (mlp.0.weight in two blocks, mlp.0.bias whole:
    a ``schema`` of 1 numeric and 2 other columns); returns the module it was made from."""
    torch.manual_seed(0)
    model = build_model("deepfm", schema, dim=4, hidden=[8, 4])
    dense = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    sparse = {name: sparse_entry(np.zeros(0, np.uint64), np.zeros((0, t.dim), np.float32), t.dim, t.spec.seed,
                                 t.spec.init_scale, dtype, Admission())
              for name, t in tables_of(model).items()}
    write_model_file(model_dict(0, None, dense, sparse, spec_of(model)), root / "model.pt")
    (root / "blocks.json").write_text(json.dumps({"mlp.0.weight.block0": ["mlp.0.weight", 0, 40],
                                                  "mlp.0.weight.block1": ["mlp.0.weight", 40, 32],
                                                  "mlp.0.bias.block0": ["mlp.0.bias", 0, 8]}))
    return model


def rows_of(ids, value: float, dim: int, dtype="float32") -> np.ndarray:
    return np.full((len(ids), dim), value, dtype)


def change(ids, value: float, table: str = "deep", tombstones=(), dtype="float32") -> dict:
    ids = np.asarray(ids, np.uint64)
    return {table: TableChange(ids, rows_of(ids, value, DIMS[table], dtype), np.asarray(tombstones, np.uint64))}


def publish(root, kind: str, server: int, seq: int, step: int, tables: dict, dense: dict | None = None,
            created: float | None = None):
    return DeltaLog(root).publish(delta(kind, server, seq, step, tables, dense, created))


def delta(kind, server, seq, step, tables, dense=None, created=None) -> Delta:
    return Delta(kind, server, seq, step, time.time() if created is None else created, tables, dense or {})
