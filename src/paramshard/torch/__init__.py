"""nn.Module integration: the Trainer (and SparseEmbedding for sparse tables)."""
from .trainer import Trainer

__all__ = ["Trainer"]
