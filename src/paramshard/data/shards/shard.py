"""This trainer's share of the data.

Items (or runs of ``batch_size`` items) are dealt round-robin to trainers and
only complete rounds are kept, so every trainer takes the same number of steps
and, in sync mode, step k of T trainers with batch b covers exactly the items
of step k of one process with batch T*b.
"""
from __future__ import annotations

from typing import Iterable, Iterator, TypeVar

from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError

T = TypeVar("T")


def shard_indices(length: int, trainer_id: int, num_trainers: int, batch_size: int = 1) -> list[int]:
    if num_trainers < 1 or not 0 <= trainer_id < num_trainers:
        raise ConfigError(f"trainer {trainer_id} of {num_trainers}: not a valid trainer index")
    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size}: must be >= 1")
    round_len = batch_size * num_trainers
    rounds = length // round_len
    out: list[int] = []
    for r in range(rounds):
        start = r * round_len + trainer_id * batch_size
        out.extend(range(start, start + batch_size))
    return out


def shard(data, batch_size: int = 1, trainer_id: int | None = None, num_trainers: int | None = None):
    """This trainer's share of ``data``.

    A sized, indexable dataset (torch Dataset, list, array) gives a
    ``torch.utils.data.Subset`` (or list) holding only this trainer's items, so
    a DataLoader over it reads only them; give the per-trainer ``batch_size``
    to keep batches contiguous. Any other iterable (a DataLoader, a generator)
    is dealt item by item (batch by batch for a DataLoader).

    Without ``trainer_id``/``num_trainers``: this process's, as the environment contract
    says (a plain run: trainer 0 of 1, as ``ps.init()`` settles it too). A pure function: it starts
    no server and takes no role (that is ``ps.init()``'s).
    """
    if trainer_id is None or num_trainers is None:
        env = ClusterEnv.from_environ()
        trainer_id = env.trainer_id if trainer_id is None else trainer_id
        num_trainers = env.num_trainers if num_trainers is None else num_trainers
    if hasattr(data, "__len__") and hasattr(data, "__getitem__"):
        indices = shard_indices(len(data), trainer_id, num_trainers, batch_size)
        try:
            from torch.utils.data import Dataset, Subset
            if isinstance(data, Dataset):
                return Subset(data, indices)
        except ImportError:
            pass
        return [data[i] for i in indices]
    return _deal(data, trainer_id, num_trainers)


def _deal(items: Iterable[T], trainer_id: int, num_trainers: int) -> Iterator[T]:
    if not 0 <= trainer_id < num_trainers:
        raise ConfigError(f"trainer {trainer_id} of {num_trainers}: not a valid trainer index")
    round_: list = []
    for item in items:
        round_.append(item)
        if len(round_) == num_trainers:
            yield round_[trainer_id]
            round_ = []
