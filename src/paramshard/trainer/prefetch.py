"""``Trainer.prefetching(loader)``: fetch the next batch's rows while this one computes.

The wrapper reads one batch ahead. While the loop body runs batch k (forward,
backward, ``trainer.step``), the pulls for batch k+1's ids are already on
their way (client/step.py), so its forward finds its rows waiting.

Which part of a batch feeds which SparseEmbedding is found out by itself:
after the first batch, each table's last forward tells which memory its ids
came from, and that is matched against the batch's integer tensors (a view
such as ``ids.reshape(-1, 1)`` matches its tensor). A model that computes its
ids inside the forward (``ids + offsets``), or a batch that is not made of
tuples, lists and dicts, needs ``ids=``: a function batch -> the ids the
forward will see (one tensor for every table, or {table: tensor}).
The forward compares the ids it gets with the prefetched ones value by value,
so a wrong guess costs a pull, never a wrong row; a table whose prefetched
rows keep going unused stops being prefetched, with a warning.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

import torch

from paramshard.data.shards.dynamic import LATER, DynamicShards
from paramshard.log import get_logger
from paramshard.trainer.sparse_embedding import SparseEmbedding, input_key

log = get_logger("trainer")

_END = object()
MISSES_BEFORE_GIVING_UP = 3      # prefetched batches in a row whose rows no forward took


def integer_leaves(batch: Any, path: tuple = ()) -> Iterator[tuple[tuple, torch.Tensor]]:
    """(path, tensor) of every integer tensor in a batch of nested tuples, lists and dicts."""
    if isinstance(batch, torch.Tensor):
        if not batch.is_floating_point() and not batch.is_complex() and batch.dtype != torch.bool:
            yield path, batch
    elif isinstance(batch, (tuple, list)):
        for i, item in enumerate(batch):
            yield from integer_leaves(item, path + (i,))
    elif isinstance(batch, dict):
        for k, item in batch.items():
            yield from integer_leaves(item, path + (k,))


def leaf_at(batch: Any, path: tuple):
    for step in path:
        batch = batch[step]
    return batch


class InputFinder:
    """Which tensor of a batch each table reads its ids from."""

    def __init__(self, tables: dict[str, SparseEmbedding], ids: Callable | None):
        self.tables, self.ids = tables, ids
        self.paths: dict[str, tuple] = {}
        self.learned = ids is not None
        self.given_up: set[str] = set()

    def inputs(self, batch) -> dict[str, torch.Tensor]:
        """{table: its ids tensor in ``batch``} for the tables known so far."""
        if self.ids is not None:
            given = self.ids(batch)
            if isinstance(given, dict):
                unknown = set(given) - set(self.tables)
                if unknown:
                    raise ValueError(f"prefetching(ids=...) named tables {sorted(unknown)} this model does "
                                     f"not have; its tables: {sorted(self.tables)}")
                found = dict(given)
            else:
                found = {name: given for name in self.tables}
        else:
            found = {name: leaf_at(batch, path) for name, path in self.paths.items()}
        return {name: t for name, t in found.items() if name not in self.given_up}

    def learn(self, batch) -> None:
        """After a batch's forward: match each table's last input with the batch's tensors."""
        if self.learned:
            return
        leaves = list(integer_leaves(batch))
        if not any(t.numel() for _, t in leaves):
            return          # an empty batch (sync, no task left): the loop runs no forward on it
        self.learned = True
        keys = {input_key(t): path for path, t in leaves}
        keys.pop(None, None)
        for name, table in self.tables.items():
            path = keys.get(table.last_input_key)
            if path is not None:
                self.paths[name] = path
            else:
                log.info("prefetching: cannot tell which part of the batch table %r reads its ids from (its "
                         "forward computes them?); its rows are pulled in the forward. Pass "
                         "trainer.prefetching(loader, ids=lambda batch: ...) to prefetch them", name)


def prefetching(trainer, iterable: Iterable, ids: Callable | None = None, fresh_rows: bool = True,
                convert: Callable | None = None) -> Iterator:
    """The batches of ``iterable`` from where the trainer is in its data (trainer/loop.py), the next
    batch's rows fetched while this one trains; after a rollback, again from the checkpoint's batch."""
    tables = trainer.tables
    finder = InputFinder(tables, ids) if tables else None
    progress = trainer.progress
    if isinstance(iterable, DynamicShards):
        iterable.bind(trainer)      # its reports ride on this trainer's steps
    iterator = _open(trainer, iterable, convert)
    current = next(iterator, _END)
    try:
        while current is not _END:
            upcoming = next(iterator, _END)
            if finder is not None and upcoming is not _END and upcoming is not LATER and trainer.model.training:
                for name, tensor in finder.inputs(upcoming).items():
                    if tensor.numel():      # an empty batch (sync, no task left) has no rows to fetch
                        trainer.prefetch_rows(tables[name], tensor, fresh_rows)
            recoveries = progress.recoveries
            yield current
            if progress.recoveries != recoveries:
                # Rolled back while this batch trained: what was fetched ahead belongs to the old
                # epoch; go on from the checkpoint's batch.
                _forget_prefetched(trainer)
                iterator = _open(trainer, iterable, convert)
                current = next(iterator, _END)
                continue
            if getattr(trainer, "leave_requested", False):
                break       # asked to leave (trainer/leave_request.py): this step was the last
            if finder is not None:
                finder.learn(current)
                _give_up_on_unused(trainer, finder)
            current = upcoming
            while current is LATER:         # DynamicShards: ready only now that the step went out
                current = next(iterator, _END)
    finally:
        progress.loop.pass_ended()
        _forget_prefetched(trainer)


def _open(trainer, iterable, convert):
    batches = trainer.progress.batches(iterable)
    trainer.progress.replay_starts()
    return map(lambda b: b if b is LATER else convert(b), batches) if convert is not None else batches


def _forget_prefetched(trainer) -> None:
    for table in trainer.tables.values():
        table.clear_prepared()
    trainer.backend.forget_fetches()


def _give_up_on_unused(trainer, finder: InputFinder) -> None:
    """A table whose prefetched rows no forward takes, batch after batch, is not prefetched any more."""
    for name in finder.tables:
        unused = trainer.backend.unused_in_a_row(name)
        if unused >= MISSES_BEFORE_GIVING_UP and name not in finder.given_up:
            finder.given_up.add(name)
            log.warning("prefetching: the rows fetched ahead for table %r went unused %d batches in a row "
                        "(its forward does not read the tensor prefetching picked); no more prefetching for "
                        "it. Pass trainer.prefetching(loader, ids=...) to name its ids", name, unused)
