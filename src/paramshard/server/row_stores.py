"""Which RowStore (row_store.py) holds a server's sparse tables: PARAMSHARD_ROW_STORE.

``compiled`` (the default) is compiled_row_store.CompiledRowStore, numba kernels;
``numpy`` is the reference store, numpy_row_store.NumpyRowStore. Both give the same
tables bit for bit, so the choice changes speed and memory, never results. Each is
imported on first use: a server without sparse tables never loads numba.
"""
from __future__ import annotations

import os
from typing import Callable, Mapping

from ..errors import ConfigError
from ..settings.process_variables import ROW_STORE
from .row_store import RowStore


def _numpy(*args, **kwargs) -> RowStore:
    from .numpy_row_store import NumpyRowStore
    return NumpyRowStore(*args, **kwargs)


def _compiled(*args, **kwargs) -> RowStore:
    from .compiled_row_store import CompiledRowStore
    return CompiledRowStore(*args, **kwargs)


STORES: dict[str, Callable[..., RowStore]] = {"compiled": _compiled, "numpy": _numpy}
DEFAULT = "compiled"


def store_named(name: str) -> Callable[..., RowStore]:
    if name not in STORES:
        raise ConfigError(f"{ROW_STORE.env}={name!r}: the row store is one of {', '.join(STORES)}")
    return STORES[name]


def configured_store(environ: Mapping[str, str] = os.environ) -> Callable[..., RowStore]:
    """The store PARAMSHARD_ROW_STORE names (``compiled`` when unset)."""
    return store_named(ROW_STORE.read(environ) or DEFAULT)
