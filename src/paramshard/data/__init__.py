"""Reading and preparing training data: schema-driven tabular readers, CTR readers,
synthetic data, sharding, metrics.

    from paramshard.data import Schema, TabularReader
    schema = Schema.load("adult.fitted.json")       # paramshard schema infer / fit
    for batch in TabularReader(["train.csv"], schema, 512, shard=(trainer_id, num_trainers), shuffle=True):
        ...  # batch.labels, batch.dense, batch.ids (+ offsets, weights); batch.torch()

    from paramshard.data import CriteoReader, shard_files
    for batch in CriteoReader(shard_files("data/train", trainer_id, num_trainers), 4096):
        ...  # batch.labels, batch.dense, batch.sparse_ids
"""
import importlib

# Each public name's submodule, imported on first use (PEP 562): `import paramshard` (every
# server, launcher and rank) reaches paramshard.data for ps.shard, and importing every reader
# here would load pandas and pyarrow (~0.6 s of CPU) into processes that never read a file.
_WHERE = {
    "TabularBatch": "batch", "CriteoBatch": "criteo", "CriteoReader": "criteo", "DataFormatError": "errors",
    "fit_schema": "fit", "feature_ids": "hashing", "infer_schema": "infer", "LibsvmReader": "libsvm",
    "SparseBatch": "libsvm", "BinaryMetrics": "metrics", "ExactAUC": "metrics", "StreamingAUC": "metrics",
    "auc": "metrics", "logloss": "metrics", "criteo_schema": "presets", "libsvm_schema": "presets",
    "Column": "schema", "Format": "schema", "Label": "schema", "Schema": "schema", "shard_files": "split",
    "split_lines": "split", "DynamicShards": "dynamic", "generate_criteo": "synthetic", "TabularReader": "tabular",
    "count_records": "tabular",
}


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'paramshard.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_WHERE])


__all__ = ["Schema", "Column", "Label", "Format", "TabularReader", "TabularBatch", "infer_schema", "fit_schema",
           "criteo_schema", "libsvm_schema", "feature_ids", "count_records",
           "CriteoReader", "CriteoBatch", "LibsvmReader", "SparseBatch", "DataFormatError",
           "generate_criteo", "split_lines", "shard_files", "DynamicShards",
           "auc", "logloss", "ExactAUC", "StreamingAUC", "BinaryMetrics"]
