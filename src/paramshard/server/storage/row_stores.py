"""Which RowStore (row_store.py) holds a server's sparse tables: PARAMSHARD_ROW_STORE.

``compiled`` (the default) is compiled_row_store.CompiledRowStore, numba kernels;
``numpy`` is the reference store, numpy_row_store.NumpyRowStore. Both give the same
tables bit for bit, so the choice changes speed and memory, never results. Each is
imported on first use: a server without sparse tables never loads numba.
A memory budget (``memory_budget=``, a server's ``server_budget=``) makes the
compiled store tiered (tiered_row_store.py); the numpy store refuses one.
"""
from __future__ import annotations

import os
from typing import Callable, Mapping

from paramshard.errors import ConfigError
from paramshard.settings.contract import ROW_STORES
from paramshard.server.storage.row_store import RowStore

VARIABLE = "PARAMSHARD_ROW_STORE"


def _numpy(*args, memory_budget=None, tier_dir=None, server_budget=None, table_name=None, **kwargs) -> RowStore:
    if memory_budget is not None or tier_dir is not None or server_budget is not None:
        raise ConfigError(f"{VARIABLE}=numpy keeps every row in RAM: a memory budget (memory_budget=, "
                          f"PARAMSHARD_MEMORY_BUDGET) needs the compiled row store, which has the disk tier; "
                          f"unset {VARIABLE} or set it to 'compiled'")
    from paramshard.server.storage.numpy_row_store import NumpyRowStore
    return NumpyRowStore(*args, **kwargs)


def _compiled(*args, memory_budget=None, tier_dir=None, server_budget=None, table_name=None,
              **kwargs) -> RowStore:
    """The compiled store; with a budget (the table's or the server's), its tiered form
    (tiered_row_store.py): rows in files under ``tier_dir``, RAM within the budget."""
    if memory_budget is not None or server_budget is not None:
        from paramshard.server.storage.tiered_row_store import TieredRowStore
        return TieredRowStore(*args, memory_budget=memory_budget, tier_dir=tier_dir, server_budget=server_budget,
                              table_name=table_name, **kwargs)
    from paramshard.server.storage.compiled_row_store import CompiledRowStore
    return CompiledRowStore(*args, **kwargs)


STORES: dict[str, Callable[..., RowStore]] = {"compiled": _compiled, "numpy": _numpy}
DEFAULT = "compiled"
assert tuple(STORES) == ROW_STORES


def store_named(name: str) -> Callable[..., RowStore]:
    if name not in STORES:
        raise ConfigError(f"{VARIABLE}={name!r}: the row store is one of {', '.join(STORES)}")
    return STORES[name]


def takes_budgets(store: Callable[..., RowStore]) -> bool:
    """Whether ``store`` (a factory of STORES) can keep rows within a memory budget."""
    return store is _compiled or getattr(store, "takes_budgets", False)


def configured_store(environ: Mapping[str, str] = os.environ) -> Callable[..., RowStore]:
    """The store PARAMSHARD_ROW_STORE names (``compiled`` when unset); a server gets it from its
    ClusterEnv (``env.row_store``, the same variable, passed on by the launcher)."""
    return store_named((environ.get(VARIABLE) or DEFAULT).strip().lower())
