"""Deterministic hashing of uint64 feature ids, shared by trainers and servers.

Everything that must agree across processes — which server owns an id, a
row's initial values, whether an id passes the probability admission filter —
is a pure function of (id, table seed) built on the splitmix64 finaliser, so
results never depend on arrival order or on how many servers there are.
"""
from __future__ import annotations

import numpy as np

_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)

# Salts keep the three uses independent of each other.
_SALT_SERVER = np.uint64(0x5E5E5E5E5E5E5E5E)
_SALT_ADMIT = np.uint64(0xADADADADADADADAD)


def mix64(x: "np.ndarray | np.uint64") -> np.ndarray:
    """splitmix64 finaliser, vectorised (uint64 arithmetic wraps, as intended)."""
    z = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> _S30)) * _C1
        z = (z ^ (z >> _S27)) * _C2
        return z ^ (z >> _S31)


def server_of(ids: np.ndarray, num_servers: int) -> np.ndarray:
    """Owner server of each id: a stable hash, independent of the table."""
    return (mix64(np.asarray(ids, np.uint64) ^ _SALT_SERVER) % np.uint64(num_servers)).astype(np.int64)


def initial_rows(seed: int, ids: np.ndarray, dim: int, scale: float) -> np.ndarray:
    """Rows uniform in [-scale, scale), a pure function of (seed, id, column).
    Each 64-bit hash gives two columns (its high and low 24 bits)."""
    ids = np.asarray(ids, np.uint64)
    pairs = (dim + 1) // 2
    with np.errstate(over="ignore"):
        base = mix64(ids ^ mix64(np.uint64(seed) * _GOLDEN + _GOLDEN))
        cols = np.arange(1, pairs + 1, dtype=np.uint64) * _GOLDEN
        h = mix64(base[:, None] + cols[None, :])
    bits = np.empty((len(ids), 2 * pairs), np.uint32)
    bits[:, 0::2] = h >> np.uint64(40)
    bits[:, 1::2] = (h >> np.uint64(8)) & np.uint64(0xFFFFFF)
    unit = bits[:, :dim].astype(np.float32) * np.float32(1.0 / (1 << 24))      # [0, 1)
    return unit * np.float32(2 * scale) - np.float32(scale)


def admitted_by_probability(seed: int, ids: np.ndarray, probability: float) -> np.ndarray:
    """The same yes/no for an id on every server and every run."""
    if probability >= 1.0:
        return np.ones(len(ids), bool)
    with np.errstate(over="ignore"):
        h = mix64(np.asarray(ids, np.uint64) ^ _SALT_ADMIT ^ mix64(np.uint64(seed)))
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53)) < probability
