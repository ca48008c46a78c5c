"""paramshard: parameter-server training for PyTorch.

    import paramshard as ps
    ps.init()
    trainer = ps.Trainer(model, optimizer=ps.optim.Adam(lr=1e-3))
    for x, y in ps.shard(loader):
        trainer.step(loss_fn(model(x), y))
    trainer.close()
"""
from importlib import metadata as _metadata

from paramshard import events, export, optim
from paramshard.data.shards.shard import shard
from paramshard.errors import ParamshardError
from paramshard.runtime import init
from paramshard.tables import Admission, Eviction

__all__ = ["init", "barrier", "shard", "optim", "Trainer", "SparseEmbedding", "Admission", "Eviction",
           "evaluate", "predict", "export", "load_model", "ParamshardError", "__version__"]

try:
    __version__ = _metadata.version("paramshard")
except _metadata.PackageNotFoundError:   # run from a source tree that was never installed
    __version__ = "0+unknown"


def barrier(name: str = "default", timeout: float | None = None) -> None:
    """Wait until every trainer of the job got to ``barrier(name)``: ``Trainer.barrier`` of
    the most recently built open Trainer of this process."""
    from paramshard.trainer.open_trainers import current_trainer
    current_trainer().barrier(name, timeout)


def _trainer_watch(env, model):
    """observe/'s listener of a Trainer (records, /metrics). Imported when a Trainer starts:
    observe/ stays out of processes that start none."""
    from paramshard.observe.live.trainer_watch import TrainerWatch
    return TrainerWatch(env, model)


def _server_watch(env, server):
    """observe/'s listener of a server process (records, /metrics), imported when one serves."""
    from paramshard.observe.live.server_watch import ServerWatch
    return ServerWatch(env, server)


def _delta_start(env, model):
    """The chief's files of a delta directory (PARAMSHARD_DELTA_DIR), written when its Trainer started."""
    if not env.delta_dir or env.trainer_id != 0:
        return None
    from paramshard.inference.delta_start import DeltaStart
    return DeltaStart(env.delta_dir)


# The observers register from the top (every process imports this package first), so the core
# (trainer/, server/, runtime, events.py) names nothing of observe/.
events.register_trainer_listener(_trainer_watch)
events.register_server_listener(_server_watch)
events.register_trainer_listener(_delta_start)


def __getattr__(name):
    # torch is imported only when a trainer-side name is used, so servers
    # (and `paramshard plan`) start fast.
    if name == "Trainer":
        from paramshard.trainer.trainer import Trainer
        return Trainer
    if name == "SparseEmbedding":
        from paramshard.trainer.sparse_embedding import SparseEmbedding
        return SparseEmbedding
    if name in ("evaluate", "predict"):
        from paramshard.inference import evaluation
        return getattr(evaluation, name)
    if name == "load_model":
        from paramshard.inference.serving import load_model
        return load_model
    raise AttributeError(f"module 'paramshard' has no attribute {name!r}")
