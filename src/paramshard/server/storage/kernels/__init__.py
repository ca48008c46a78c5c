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
"""
