"""Memory budgets as people write them: ``"4GB"``, ``"512MiB"``, ``"1.5G"`` or a number of bytes.

A budget caps the memory a sparse table (``SparseEmbedding(..., memory_budget=)``)
or a whole server (PARAMSHARD_MEMORY_BUDGET, ``paramshard server
--memory-budget``) keeps in RAM; the rows past it live in a file tier
(server/storage/tiered_row_store.py). Decimal units are powers of 1000, binary ones
(KiB, MiB, GiB, TiB) powers of 1024; a bare ``K``/``M``/``G``/``T`` is binary, as
``ulimit`` and Kubernetes' ``Gi`` read it.
"""
from __future__ import annotations

import math
import re

from paramshard.errors import ConfigError

MIN_BUDGET = 8 << 20          # below this a tier spills on every call: a typo more likely than a plan
MAX_BUDGET = (1 << 63) - 1
UNITS = {"": 1, "b": 1,
         "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
         "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
         "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}
_TEXT = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*")


def parse_budget(value, what: str = "memory_budget") -> int | None:
    """Bytes of ``value`` (None stays None: no budget); ConfigError naming ``what`` for anything
    else than a size of at least MIN_BUDGET."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{what}={value!r}: a size in bytes or text like '4GB', '512MiB', '1.5G'")
    if isinstance(value, int):
        size = value
    elif isinstance(value, float) and math.isfinite(value) and value == int(value):
        size = int(value)
    elif isinstance(value, str):
        match = _TEXT.fullmatch(value)
        unit = UNITS.get(match.group(2).lower()) if match else None
        if match is None or unit is None:
            raise ConfigError(f"{what}={value!r}: not a size; write bytes or a number with a unit, like "
                              f"'4GB', '512MiB' or '1.5G' (units: {', '.join(u for u in UNITS if u)})")
        size = int(float(match.group(1)) * unit)
    else:
        raise ConfigError(f"{what}={value!r}: a size in bytes or text like '4GB', '512MiB', '1.5G'")
    if not MIN_BUDGET <= size <= MAX_BUDGET:
        raise ConfigError(f"{what}={value!r} is {size} bytes: a memory budget is at least {MIN_BUDGET >> 20} MiB "
                          f"(and fits in 63 bits)")
    return size


def show_bytes(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"
