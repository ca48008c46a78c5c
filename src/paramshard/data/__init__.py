"""Reading and preparing training data: CTR readers, synthetic data, sharding, metrics.

    from paramshard.data import CriteoReader, shard_files
    for batch in CriteoReader(shard_files("data/train", trainer_id, num_trainers), 4096):
        ...  # batch.labels, batch.dense, batch.sparse_ids
"""
from .criteo import CriteoBatch, CriteoReader
from .errors import DataFormatError
from .libsvm import LibsvmReader, SparseBatch
from .metrics import auc, logloss
from .split import shard_files, split_lines
from .synthetic import generate_criteo

__all__ = ["CriteoReader", "CriteoBatch", "LibsvmReader", "SparseBatch", "DataFormatError",
           "generate_criteo", "split_lines", "shard_files", "auc", "logloss"]
