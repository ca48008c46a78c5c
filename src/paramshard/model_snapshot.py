"""A model file of a job while it trains: its "best epoch so far", without a checkpoint.

    trainer.pull()                                   # dense values as the servers hold them
    if trainer.is_chief and auc > best:
        snapshot_model(trainer, "runs/best.pt")      # what export-model writes, from the live job

The file is the one ``export_model`` writes from a checkpoint (serving.py), the
model's spec included: the dense values this trainer holds (``trainer.pull()``
first, or a sync trainer's values after its last step), every SparseEmbedding
table's rows (ids and values; the optimizer's state stays on the servers) read
from the servers as a checkpoint reads them, and in sync mode once every table
has completed this trainer's steps. Collective and hybrid modes: hashed tables
(paramshard.models.hashed) are ordinary module parameters, so they are in the
dense part, as a checkpoint's would be.

Only this trainer calls it; the others train on (async) or wait at their next
step (sync) while the tables are read: no barrier is needed, and none is taken.
"""
from __future__ import annotations

from .client.checkpoint import gather_table
from .model_spec import spec_of
from .serving import model_dict, sparse_entry, write_model_file


def snapshot_model(trainer, out) -> dict:
    """Write the model ``trainer`` trains, at its current step, to ``out`` (replaced
    atomically). Returns the written dict (as ``export_model`` does)."""
    trainer.backend.flush()        # this trainer's pushes are on the servers
    step = trainer.step_count
    # Copies: the trainer's values are its parameters' memory, and training goes on.
    dense = {name: trainer._values[name].reshape(p.shape).copy() for name, p in trainer._params}
    sparse = {}
    if trainer.tables:
        min_version = trainer.backend.row_version(step)     # what a pull at this step waits for
        for name, table in trainer.tables.items():
            parts, _, _ = gather_table(trainer.links, name, min_version, only=("ids", "values"))
            spec = table.spec
            sparse[name] = sparse_entry(parts["ids"], parts["values"], spec.dim, spec.seed, spec.init_scale,
                                        spec.dtype, spec.admission)
    model = model_dict(step, None, dense, sparse, spec_of(trainer.model))
    write_model_file(model, out)
    return model
