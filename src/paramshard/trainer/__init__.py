"""nn.Module integration: the Trainer (and SparseEmbedding for sparse tables)."""
from paramshard.trainer.trainer import Trainer

__all__ = ["Trainer"]
