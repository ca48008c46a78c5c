"""Compiled kernels of the compiled row store (compiled_row_store.py), written with numba.

Each module has one job: ``hash_index`` (uint64 id -> row, grown without a
stall), ``arena`` (row arrays mapped in proportion to a table, grown by mremap, filled on demand),
``initial_rows`` (a new row's values, bit for bit those of
placement.sparse_hash.initial_rows), ``update_kernels`` (the update rules,
bit for bit those of update_rules.rules, fused with the gather and scatter) and
``half`` (float16 / bfloat16 rows as uint16 bits: the conversions, and the
load/store helpers through which every kernel reads and writes a row value).

Every kernel is compiled once per machine and cached next to its source
(``cache=True``, warm.py), with numpy's error model (a division by zero gives
inf as numpy's does, instead of a Python exception checked at every division,
which also kept loops from vectorising: 3x slower updates) and no fast-math: float32 operations happen in the order
numpy does them, which is what makes the tables bit-identical to the numpy
reference store's.

The kernels that take only arrays and numbers (the index's, the row kernels, the half
conversions, the initial rows, the tier's stamps; not the update rules, which take a list of
slot arrays) run with the GIL released (``nogil=True``): a serving replica applies a delta to
one copy of a table in one thread while other threads look rows up in the other copy
(serving/versions.py), and a kernel of 8192 rows holding the GIL stalled those lookups for its
whole call. A store is still used by one thread at a time (the server's loop; the replica's
copy lock): releasing the GIL lets other work run, it does not make a store shareable.
"""
