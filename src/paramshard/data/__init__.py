"""Reading and preparing training data: schema-driven tabular readers, CTR readers,
synthetic data, sharding, metrics.

    from paramshard.data import Schema, TabularReader
    schema = Schema.load("adult.fitted.json")       # paramshard schema infer / fit
    for batch in TabularReader(["train.csv"], schema, 512, shard=(trainer_id, num_trainers), shuffle=True):
        ...  # batch.labels, batch.dense, batch.ids (+ offsets, weights); batch.torch()

    from paramshard.data import CriteoReader, shard_files
    for batch in CriteoReader(shard_files("data/train", trainer_id, num_trainers), 4096):
        ...  # batch.labels, batch.dense, batch.sparse_ids

    from paramshard.data import StreamReader, open_stream   # a live stream (data/stream/reader.py)
    reader = StreamReader(open_stream("data/live", trainer_id, num_trainers), trainer, 512)
"""
import importlib

# Each public name's submodule, imported on first use (PEP 562): `import paramshard` (every
# server, launcher and rank) reaches paramshard.data for ps.shard, and importing every reader
# here would load pandas and pyarrow (~0.6 s of CPU) into processes that never read a file.
_WHERE = {
    "TabularBatch": "features.batch", "CriteoBatch": "readers.criteo", "CriteoReader": "readers.criteo", "DataFormatError": "errors",
    "fit_schema": "features.fit", "feature_ids": "features.hashing", "infer_schema": "features.infer", "LibsvmReader": "readers.libsvm",
    "SparseBatch": "readers.libsvm", "BinaryMetrics": "metrics", "ExactAUC": "metrics", "StreamingAUC": "metrics",
    "auc": "metrics", "logloss": "metrics", "criteo_schema": "features.presets", "libsvm_schema": "features.presets",
    "Column": "paramshard.specs.schema", "Format": "paramshard.specs.schema", "Label": "paramshard.specs.schema", "Schema": "paramshard.specs.schema", "shard_files": "shards.split",
    "split_lines": "shards.split", "DynamicShards": "shards.dynamic", "generate_criteo": "synthetic", "TabularReader": "readers.tabular",
    "count_records": "readers.tabular",
    "StreamSource": "stream.source", "StreamBatch": "stream.source", "DirectoryStream": "stream.directory",
    "open_stream": "stream.open", "StreamReader": "stream.reader",
}


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'paramshard.data' has no attribute {name!r}")
    # A room of data/ (relative), or a module below it (the schema: paramshard.specs).
    where = module if module.startswith("paramshard.") else f"{__name__}.{module}"
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_WHERE])


__all__ = ["Schema", "Column", "Label", "Format", "TabularReader", "TabularBatch", "infer_schema", "fit_schema",
           "criteo_schema", "libsvm_schema", "feature_ids", "count_records",
           "CriteoReader", "CriteoBatch", "LibsvmReader", "SparseBatch", "DataFormatError",
           "generate_criteo", "split_lines", "shard_files", "DynamicShards",
           "auc", "logloss", "ExactAUC", "StreamingAUC", "BinaryMetrics",
           "StreamSource", "StreamBatch", "DirectoryStream", "open_stream", "StreamReader"]
