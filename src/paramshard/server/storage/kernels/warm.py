"""Compile every kernel of the compiled row store now, into numba's on-disk cache.

A kernel compiles on its first call (seconds of CPU each); cached, a later
process loads it in milliseconds. `make venv` runs this once after installing,
so no server compiles while a trainer waits on its first pull:

    python -m paramshard.server.storage.kernels.warm
"""
from __future__ import annotations

import hashlib
import pathlib
import time

import numpy as np

from paramshard.optim import KINDS
from paramshard.update_rules import make_rule


HERE = pathlib.Path(__file__).parent


def drop_stale_cache() -> bool:
    """Numba checks only a kernel's own file for changes, not the files of the helpers it
    inlines (hash_index.find in row_kernels, say): after any kernel source changed, drop the
    whole cache so nothing compiled from an old helper survives. True if it was dropped."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(HERE.glob("*.py")))).hexdigest()
    cache, stamp = HERE / "__pycache__", HERE / "__pycache__" / "kernels.sources"
    if stamp.exists() and stamp.read_text() == digest:
        return False
    for entry in cache.glob("*.nb[ic]"):
        entry.unlink(missing_ok=True)
    try:
        cache.mkdir(exist_ok=True)
        stamp.write_text(digest)
    except OSError:                      # a read-only install: numba caches elsewhere, by its own rules
        pass
    return True


def exercise(store) -> None:
    """Every operation of a (new, empty) compiled store once, on a few rows: compiles or loads
    each kernel it uses, growth and draining included."""
    ids = np.arange(1, 400, dtype=np.uint64)
    rows = store.lookup_or_create(ids, 0, 1, 0.01)
    store.create(ids + np.uint64(1000), np.zeros((len(ids), store.dim), np.float32), 0)
    store.lookup_or_create(ids + np.uint64(5000), 0, 1, 0.01)
    store.update(rows, np.ones((len(rows), store.dim), np.float32), 0.5, version=1)
    store.gather(store.lookup(ids))
    store.page(0, 10)
    if store.count_index is not None:
        store.count(ids[:3])
    store.touch(rows[:5], 3)
    if not hasattr(store, "tier_stats"):      # a tiered table never moves: it never drops rows
        store.drop(ids[::7])
    if store.last_seen is not None:
        store.evict_unseen(2)
    store.clear()


def warm() -> float:
    """Run a tiny store through every operation with every update rule; seconds taken."""
    drop_stale_cache()
    from paramshard.server.storage.compiled_row_store import CompiledRowStore
    from paramshard.server.storage.tiered_row_store import TieredRowStore
    started = time.perf_counter()
    # float32 rows, and half rows (uint16 bits: one more compilation of each kernel, the same
    # for every half format and rounding, which are arguments).
    for value_dtype, rounding in (("float32", "nearest"), ("float16", "stochastic")):
        for config in KINDS.values():
            exercise(CompiledRowStore(4, make_rule(config()), keep_last_seen=True, count_admissions=True,
                                      max_rows=1 << 16, capacity=16, value_dtype=value_dtype, rounding=rounding))
            # The disk tier's kernels, over the file-backed arrays of a tiered store (its own temp dir).
            tiered = TieredRowStore(4, make_rule(config()), keep_last_seen=True, count_admissions=True,
                                    max_rows=1 << 16, capacity=16, value_dtype=value_dtype, rounding=rounding,
                                    memory_budget=8 << 20)
            exercise(tiered)
            tiered.close()
    return time.perf_counter() - started


if __name__ == "__main__":
    print(f"paramshard: row store kernels compiled and cached in {warm():.1f} s")
