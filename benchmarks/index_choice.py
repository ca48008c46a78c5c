"""Why numba: the id index of a sparse table three ways, side by side, one process.

- numba: kernels/hash_index.HashIndex (what the compiled store uses).
- numpy: server/id_index.IdIndex (vectorised rounds of linear probing; the numpy store's).
- pandas: pandas' khash UInt64HashTable (compiled C, a wheel like numba). Its
  map_locations maps a batch to positions 0..n-1 of that batch, with no offset and
  no way to add a batch to an existing table under other numbers, so a growing
  table must be rebuilt from all its ids (or filled by a Python loop of set_item):
  measured here as the rebuild a batch of new ids costs.

For each: lookups of ``--lookups`` random existing ids in a table of ``--rows`` ids,
and adding a batch of ``--batch`` new ids to it; medians of ``--repeats``, interleaved.

    .venv/bin/python benchmarks/index_choice.py [--rows 4000000] [--markdown]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


class NumbaIndex:
    def __init__(self, ids):
        from paramshard.server.storage.kernels import arena
        from paramshard.server.storage.kernels.hash_index import HashIndex
        self.keys = arena.reserve(len(ids) * 2, (), np.uint64)
        self.index, self.rows = HashIndex(0), 0
        self.add(ids)

    def add(self, ids):
        self.index.make_room(self.keys, self.rows, len(ids))
        self.keys[self.rows:self.rows + len(ids)] = ids
        self.index.insert(self.keys, self.rows, len(ids))
        self.rows += len(ids)

    def lookup(self, ids):
        return self.index.lookup(self.keys, ids)


class NumpyIndex:
    def __init__(self, ids):
        from paramshard.server.storage.id_index import IdIndex
        self.index = IdIndex(16)
        self.index.insert(ids)

    def add(self, ids):
        self.index.insert(ids)

    def lookup(self, ids):
        return self.index.lookup(ids)


class PandasIndex:
    def __init__(self, ids):
        self.ids = ids
        self._build()

    def _build(self):
        from pandas._libs import hashtable
        self.table = hashtable.UInt64HashTable(len(self.ids))
        self.table.map_locations(self.ids)

    def add(self, ids):
        self.ids = np.concatenate([self.ids, ids])
        self._build()

    def lookup(self, ids):
        return self.table.lookup(ids)


KINDS = {"numba": NumbaIndex, "numpy": NumpyIndex, "pandas": PandasIndex}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=4_000_000)
    p.add_argument("--lookups", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    from paramshard.placement.sparse_hash import mix64
    from paramshard.server.storage.kernels.warm import warm
    warm()
    print(C.machine_note(), flush=True)
    base = mix64(np.arange(args.rows, dtype=np.uint64))
    built = {}
    for name, kind in KINDS.items():
        started = time.perf_counter()
        built[name] = kind(base.copy())
        print(f"{name}: built {args.rows:,} ids in {time.perf_counter() - started:.2f} s", flush=True)
    rng = np.random.default_rng(0)
    times = {name: {"lookup": [], "add": []} for name in KINDS}
    for r in range(args.repeats):
        probe = base[rng.integers(0, args.rows, args.lookups)]
        fresh = mix64(np.arange(args.rows + r * args.batch, args.rows + (r + 1) * args.batch, dtype=np.uint64))
        for name in KINDS:
            index = built[name]
            started = time.perf_counter()
            found = index.lookup(probe)
            times[name]["lookup"].append(time.perf_counter() - started)
            assert (np.asarray(found) >= 0).all(), name
            started = time.perf_counter()
            index.add(fresh)
            times[name]["add"].append(time.perf_counter() - started)
    rows = []
    for name in KINDS:
        lookup = statistics.median(times[name]["lookup"])
        add = statistics.median(times[name]["add"])
        rows.append((name, args.lookups / lookup, lookup * 1e3, args.batch / add, add * 1e3))
    numba_lookup, numba_add = rows[0][1], rows[0][3]
    if args.markdown:
        print(f"\n| index | lookups/s ({args.lookups:,} of {args.rows:,}) | ms | vs numba | "
              f"inserts/s (batches of {args.batch:,}) | ms | vs numba |")
        print("|---|---:|---:|---:|---:|---:|---:|")
    for name, lrate, lms, arate, ams in rows:
        if args.markdown:
            print(f"| {name} | {lrate / 1e6:.2f}M | {lms:.1f} | {lrate / numba_lookup:.2f}x | {arate / 1e6:.2f}M | "
                  f"{ams:.1f} | {arate / numba_add:.2f}x |")
        else:
            print(f"{name}: lookup {lrate / 1e6:.2f}M/s ({lms:.1f} ms), add {arate / 1e6:.2f}M/s ({ams:.1f} ms)")
    print(f"\n_{args.repeats} rounds interleaved, medians; {C.machine_note()}_")
    return 0


if __name__ == "__main__":
    sys.exit(main())
