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
from .batch import TabularBatch
from .criteo import CriteoBatch, CriteoReader
from .errors import DataFormatError
from .fit import fit_schema
from .hashing import feature_ids
from .infer import infer_schema
from .libsvm import LibsvmReader, SparseBatch
from .metrics import BinaryMetrics, ExactAUC, StreamingAUC, auc, logloss
from .presets import criteo_schema, libsvm_schema
from .schema import Column, Format, Label, Schema
from .split import shard_files, split_lines
from .synthetic import generate_criteo
from .tabular import TabularReader, count_records

__all__ = ["Schema", "Column", "Label", "Format", "TabularReader", "TabularBatch", "infer_schema", "fit_schema",
           "criteo_schema", "libsvm_schema", "feature_ids", "count_records",
           "CriteoReader", "CriteoBatch", "LibsvmReader", "SparseBatch", "DataFormatError",
           "generate_criteo", "split_lines", "shard_files",
           "auc", "logloss", "ExactAUC", "StreamingAUC", "BinaryMetrics"]
