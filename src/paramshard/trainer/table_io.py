"""``Trainer.export_table`` / ``import_table``: a table's rows to and from a file (paramshard.export)."""
from __future__ import annotations

from paramshard.errors import ConfigError


def table(trainer, name: str):
    if name not in trainer.tables:
        raise ConfigError(f"no SparseEmbedding named {name!r} in this model; tables: {sorted(trainer.tables)}")
    return trainer.tables[name]


def export_table(trainer, name: str, path) -> int:
    from paramshard.export import save_table
    table(trainer, name)
    trainer.backend.flush()      # a table exists only with servers
    ids, values, meta = trainer.backend.export_table(name)
    save_table(path, meta, ids, values)
    return len(ids)


def import_table(trainer, name: str, path) -> int:
    from paramshard.export import load_table
    dim = table(trainer, name).dim
    exported = load_table(path)
    if exported.dim != dim:
        raise ConfigError(f"{path}: rows of dim {exported.dim}, table {name!r} has dim {dim}")
    trainer.backend.import_table(name, exported.ids, exported.values)
    return len(exported.ids)
