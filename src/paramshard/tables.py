"""Per-table settings of sparse tables: admission and eviction policies, row storage format.

Frozen and validated on creation; they travel to the servers as plain maps.
"""
from __future__ import annotations

import dataclasses
import math

from paramshard.errors import ConfigError

MAX_SEED = (1 << 64) - 1   # seeds are mixed as uint64

# How a table's rows are stored on the servers (server/storage/row_formats.py): the maths is float32
# whatever the format; half rows are rounded to nearest, or stochastically, after each update.
ROW_DTYPES = ("float32", "float16", "bfloat16")
ROUNDINGS = ("nearest", "stochastic")


def check_table_settings(name: str, dim, seed, init_scale) -> None:
    """Checked where a table is declared (and again on the server): a bad value
    fails at construction, not on a server at the first forward."""
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
        raise ConfigError(f"table {name!r}: dim must be a whole number >= 1, got {dim!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"table {name!r}: seed must be a whole number in 0..2**64-1, got {seed!r}")
    if not isinstance(init_scale, (int, float)) or isinstance(init_scale, bool) \
            or not math.isfinite(init_scale) or init_scale < 0:
        raise ConfigError(f"table {name!r}: init_scale must be a finite number >= 0, got {init_scale!r}")


def check_row_format(name: str, dtype, rounding) -> None:
    """The storage format of a table's rows: a dtype of ROW_DTYPES, a rounding of ROUNDINGS."""
    if dtype not in ROW_DTYPES or not isinstance(dtype, str):
        raise ConfigError(f"table {name!r}: rows are stored as one of {', '.join(ROW_DTYPES)}, got {dtype!r}")
    if rounding not in ROUNDINGS or not isinstance(rounding, str):
        raise ConfigError(f"table {name!r}: rounding is one of {', '.join(ROUNDINGS)}, got {rounding!r}")
    if dtype == "float32" and rounding != "nearest":
        raise ConfigError(f"table {name!r}: stochastic rounding is for half-precision rows (float16, bfloat16); "
                          f"float32 rows are never rounded")


@dataclasses.dataclass(frozen=True)
class Admission:
    """When a new id gets a row of its own. Until then it reads as zeros and its
    gradients are dropped (the rare tail of a CTR feature space is mostly noise).

    min_count: the id must have been pulled this many times (counted per step).
    probability: the id is admitted with this probability, decided by a hash of
    (table seed, id), so every server and every run agrees.
    """
    min_count: int = 1
    probability: float = 1.0

    def __post_init__(self):
        if not isinstance(self.min_count, int) or isinstance(self.min_count, bool) or self.min_count < 1:
            raise ConfigError(f"Admission(min_count={self.min_count!r}): a whole number >= 1")
        if not isinstance(self.probability, (int, float)) or isinstance(self.probability, bool) \
                or not 0.0 < self.probability <= 1.0:
            raise ConfigError(f"Admission(probability={self.probability!r}): in (0, 1]")


@dataclasses.dataclass(frozen=True)
class Eviction:
    """Drop rows that no trainer has pulled for ``unseen_steps`` table steps."""
    unseen_steps: int = 0          # 0: never evict

    def __post_init__(self):
        if not isinstance(self.unseen_steps, int) or isinstance(self.unseen_steps, bool) or self.unseen_steps < 0:
            raise ConfigError(f"Eviction(unseen_steps={self.unseen_steps!r}): a whole number >= 0")


def policy_to_wire(admission: Admission, eviction: Eviction, init_scale: float) -> dict:
    return {"min_count": admission.min_count, "probability": admission.probability,
            "unseen_steps": eviction.unseen_steps, "init_scale": init_scale}


_POLICY_FIELDS = {"min_count": int, "probability": float, "unseen_steps": int, "init_scale": float}


def policy_from_wire(data: dict) -> tuple[Admission, Eviction, float]:
    """Checked, never converted: "2", 2.5 or True are not a count."""
    if not isinstance(data, dict) or set(data) != set(_POLICY_FIELDS):
        raise ConfigError(f"bad table policy {data!r}: expected exactly the keys {sorted(_POLICY_FIELDS)}")
    for key, kind in _POLICY_FIELDS.items():
        value = data[key]
        allowed = (int,) if kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, allowed):
            raise ConfigError(f"bad table policy: {key} must be {kind.__name__}, got {value!r}")
    return (Admission(data["min_count"], float(data["probability"])), Eviction(data["unseen_steps"]),
            float(data["init_scale"]))
