"""Per-table settings of sparse tables: admission and eviction policies.

Frozen and validated on creation; they travel to the servers as plain maps.
"""
from __future__ import annotations

import dataclasses

from .errors import ConfigError


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
        if not isinstance(self.min_count, int) or self.min_count < 1:
            raise ConfigError(f"Admission(min_count={self.min_count!r}): a whole number >= 1")
        if not 0.0 < self.probability <= 1.0:
            raise ConfigError(f"Admission(probability={self.probability!r}): in (0, 1]")


@dataclasses.dataclass(frozen=True)
class Eviction:
    """Drop rows that no trainer has pulled for ``unseen_steps`` table steps."""
    unseen_steps: int = 0          # 0: never evict

    def __post_init__(self):
        if not isinstance(self.unseen_steps, int) or self.unseen_steps < 0:
            raise ConfigError(f"Eviction(unseen_steps={self.unseen_steps!r}): a whole number >= 0")


def policy_to_wire(admission: Admission, eviction: Eviction, init_scale: float) -> dict:
    return {"min_count": admission.min_count, "probability": admission.probability,
            "unseen_steps": eviction.unseen_steps, "init_scale": init_scale}


def policy_from_wire(data: dict) -> tuple[Admission, Eviction, float]:
    try:
        return (Admission(int(data["min_count"]), float(data["probability"])),
                Eviction(int(data["unseen_steps"])), float(data["init_scale"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"bad table policy {data!r}: {exc}") from None
