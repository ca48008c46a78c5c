"""Compile every kernel of the compiled row store now, into numba's on-disk cache.

A kernel compiles on its first call (seconds of CPU each); cached, a later
process loads it in milliseconds. `make venv` runs this once after installing,
so no server compiles while a trainer waits on its first pull:

    python -m paramshard.server.kernels.warm
"""
from __future__ import annotations

import time

import numpy as np

from ...optim import KINDS
from ...update_rules import make_rule


def warm() -> float:
    """Run a tiny store through every operation with every update rule; seconds taken."""
    from ..compiled_row_store import CompiledRowStore
    started = time.perf_counter()
    ids = np.arange(1, 40, dtype=np.uint64)
    # float32 rows, and half rows (uint16 bits: one more compilation of each kernel, the same
    # for every half format and rounding, which are arguments).
    for value_dtype, rounding in (("float32", "nearest"), ("float16", "stochastic")):
        for kind, config in KINDS.items():
            store = CompiledRowStore(4, make_rule(config()), keep_last_seen=True, count_admissions=True,
                                     max_rows=1 << 16, capacity=16, value_dtype=value_dtype, rounding=rounding)
            rows = store.lookup_or_create(ids, 0, 1, 0.01)
            store.create(ids + np.uint64(100), np.zeros((len(ids), 4), np.float32), 0)
            store.update(rows, np.ones((len(rows), 4), np.float32), 0.5, version=1)
            store.gather(store.lookup(ids))
            store.page(0, 10)
            store.count(ids[:3])
            store.touch(rows[:5], 3)
            store.evict_unseen(2)
    return time.perf_counter() - started


if __name__ == "__main__":
    print(f"paramshard: row store kernels compiled and cached in {warm():.1f} s")
