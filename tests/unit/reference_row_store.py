"""A RowStore (server/storage/row_store.py) written the slow, obvious way: a dict and one Python call per
row. The oracle for the contract: any store must give the same tables for the same calls.

Half-precision rows are held as float32 values already rounded, one value at a time: float16
through np.float16(x), bfloat16 through the round-to-nearest-even formula on its bits, and
stochastic rounding from exact fractions: the neighbours lo (toward zero) and hi (away from
zero) of x, p = (|x| - |lo|) / (|hi| - |lo|), hi iff u < p for u the top 24 (float16) or 16
(bfloat16) bits of the value's random word over 2**24 (2**16)."""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from paramshard.placement.sparse_hash import initial_rows

F32 = np.float32
MASK = (1 << 64) - 1
GOLDEN, SALT_ROUND = 0x9E3779B97F4A7C15, 0x3C3C3C3C3C3C3C3C


def mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def random_word(seed: int, key: int, version: int, column: int) -> int:
    """The 32 random bits stochastic rounding uses for one value (server/storage/row_formats.py)."""
    noise = mix64((mix64(key ^ mix64(seed ^ SALT_ROUND)) + (version + 1) * GOLDEN) & MASK)
    return mix64((noise + (column + 1) * GOLDEN) & MASK) >> 32


def bf16_value(bits: int) -> float:
    return float(np.array([bits << 16], np.uint32).view(np.float32)[0])


def to_bfloat16(x, word=None) -> np.float32:
    x = F32(x)
    bits = int(np.array([x], np.float32).view(np.uint32)[0])
    if np.isnan(x):
        return F32(bf16_value((bits >> 16) | 0x40))
    if word is None or not np.isfinite(x):
        return F32(bf16_value((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16))
    lo = bits >> 16                                   # toward zero: the top 16 bits
    exponent = (lo >> 7) & 0xFF
    gap = Fraction(2) ** (max(exponent, 1) - 127 - 7)    # the spacing of bfloat16 numbers at lo
    p = (abs(Fraction(float(x))) - abs(Fraction(bf16_value(lo)))) / gap
    return F32(bf16_value(lo + 1) if Fraction(word >> 16, 1 << 16) < p else bf16_value(lo))


def to_float16(x, word=None) -> np.float32:
    x = F32(x)
    with np.errstate(over="ignore"):
        near = np.float16(x)
    if word is None or not np.isfinite(x):
        return F32(near)
    toward_zero = np.isfinite(near) and abs(Fraction(float(near))) <= abs(Fraction(float(x)))
    lo = near if toward_zero else np.nextafter(near, np.float16(0))
    with np.errstate(over="ignore"):
        hi = np.nextafter(lo, np.float16(np.copysign(np.inf, x)))             # away from zero (65504: inf)
    gap = abs(Fraction(float(hi)) - Fraction(float(lo))) if np.isfinite(hi) else Fraction(32)
    p = (abs(Fraction(float(x))) - abs(Fraction(float(lo)))) / gap
    return F32(hi if Fraction(word >> 8, 1 << 24) < p else lo)


ROUND = {"float16": to_float16, "bfloat16": to_bfloat16}


def rowwise_adagrad(config, param, grad, acc, scale):
    """One row of row-wise Adagrad, one float32 scalar at a time in the order
    RowWiseAdagradRule documents: (new param, new accumulator)."""
    g = [F32(x) for x in grad]
    if scale != 1.0:
        g = [x * F32(scale) for x in g]
    if config.weight_decay:
        g = [x + F32(config.weight_decay) * F32(p) for x, p in zip(g, param)]
    total = g[0] * g[0]
    for x in g[1:]:
        total = total + x * x
    acc = F32(acc) + total / F32(len(g))
    multiplier = F32(config.lr) / (F32(np.sqrt(acc)) + F32(config.eps))
    return np.array([F32(p) - multiplier * x for p, x in zip(param, g)], F32), np.array([acc], F32)


class DictRowStore:
    def __init__(self, dim, rule, keep_last_seen, count_admissions, value_dtype="float32", rounding="nearest",
                 seed=0, **ignored):   # max_rows, capacity
        self.dim, self.rule = dim, rule
        self.value_dtype, self.rounding, self.seed = value_dtype, rounding, seed
        self.slot_count = len(rule.init_slots((1, dim)))
        self.slot_widths = [s.shape[1] for s in rule.init_slots((1, dim))]     # dim, or 1 (per row)
        self.keeps_steps, self.keeps_last_seen = rule.uses_step, keep_last_seen
        self.counting = count_admissions
        self.clear()

    def set_rule(self, rule):
        self.rule = rule

    def clear(self):
        self.row_of, self.rows, self.seen = {}, [], {}    # rows: [id, values, slots, steps, last_seen]

    @property
    def num_rows(self):
        return len(self.rows)

    @property
    def nbytes(self):
        value_bytes = 4 if self.value_dtype == "float32" else 2
        per_row = value_bytes * self.dim + 4 * sum(self.slot_widths) + 4 * (self.keeps_steps + self.keeps_last_seen) + 8
        return len(self.rows) * per_row + 12 * len(self.seen)

    def _rounded(self, values, key=None, version=None):
        """A row's float32 values as the table's format holds them (random words: an update's)."""
        values = np.array(values, np.float32)
        if self.value_dtype == "float32":
            return values
        to = ROUND[self.value_dtype]
        if version is None or self.rounding == "nearest":
            return np.array([to(v) for v in values], np.float32)
        return np.array([to(v, random_word(self.seed, key, version, j)) for j, v in enumerate(values)], np.float32)

    def reserve(self, rows):
        pass

    def lookup(self, ids):
        return np.array([self.row_of.get(int(i), -1) for i in ids], np.int64)

    def create(self, ids, values, version, state=None):
        state = state or {}
        out = []
        for k, i in enumerate(ids):
            slots = [s[0].copy() for s in self.rule.init_slots((1, self.dim))]
            for j in range(self.slot_count):
                if f"slot{j}" in state:
                    slots[j] = state[f"slot{j}"][k].copy()
            steps = int(state["steps"][k]) if "steps" in state else 0
            last = int(state["last_seen"][k]) if "last_seen" in state else version
            self.row_of[int(i)] = len(self.rows)
            out.append(len(self.rows))
            self.rows.append([int(i), self._rounded(values[k]), slots, steps, last])
        return np.array(out, np.int64)

    def lookup_or_create(self, ids, version, seed, init_scale):
        out = []
        for i in ids:                      # one id at a time: a new id's row exists for its repeats
            if int(i) not in self.row_of:
                key = np.array([i], np.uint64)
                self.create(key, initial_rows(seed, key, self.dim, init_scale), version)
            out.append(self.row_of[int(i)])
        return np.array(out, np.int64)

    def gather(self, rows):
        return np.array([self.rows[r][1] for r in rows], np.float32).reshape(len(rows), self.dim)

    def set_values(self, rows, values):
        for r, v in zip(rows, values):
            self.rows[r][1] = self._rounded(v)

    def set_state(self, rows, version, state):
        for k, r in enumerate(np.asarray(rows).tolist()):       # one row at a time, as create does
            fresh = [s[0].copy() for s in self.rule.init_slots((1, self.dim))]
            self.rows[r][2] = [state[f"slot{j}"][k].copy() if f"slot{j}" in state else fresh[j]
                               for j in range(self.slot_count)]
            self.rows[r][3] = int(state["steps"][k]) if "steps" in state else 0
            self.rows[r][4] = int(state["last_seen"][k]) if "last_seen" in state else version

    def update(self, rows, grads, scale, version=0):
        for r, g in zip(rows, grads):
            row = self.rows[r]
            row[3] += 1
            if self.rule.config.kind == "rowwise_adagrad":     # the maths again, not the rule's code
                new, acc = rowwise_adagrad(self.rule.config, row[1], g, row[2][0][0], scale)
                row[1], row[2] = self._rounded(new, row[0], version), [acc]
                continue
            param, slots = row[1][None, :].copy(), [s[None, :].copy() for s in row[2]]
            step = np.array([[row[3]]], np.uint32) if self.keeps_steps else 1
            self.rule.apply(param, g[None, :], slots, step, scale=scale)
            row[1], row[2] = self._rounded(param[0], row[0], version), [s[0] for s in slots]

    def touch(self, rows, version):
        for r in rows:
            self.rows[r][4] = version

    def count(self, ids):
        for i in ids:
            self.seen[int(i)] = self.seen.get(int(i), 0) + 1
        return np.array([self.seen[int(i)] for i in ids], np.uint32)

    def counted(self, ids):
        return np.array([int(i) in self.seen for i in ids], bool)

    def restore_counts(self, ids, counts):
        if self.counting:
            self.seen.update((int(i), int(c)) for i, c in zip(ids, counts))

    def counters(self):
        if not self.counting:
            return None
        return np.array(list(self.seen), np.uint64), np.array(list(self.seen.values()), np.int64)

    def evict_unseen(self, before):
        kept = [row for row in self.rows if row[4] >= before]
        evicted = len(self.rows) - len(kept)
        self.rows = kept
        self.row_of = {row[0]: r for r, row in enumerate(kept)}
        return evicted

    def drop(self, ids):
        """The contract's order (row_store.swap_plan), one row at a time: the last row that stays
        fills the lowest place of a row that goes."""
        gone = set(np.asarray(ids, np.uint64).tolist())
        doomed = sorted(self.row_of[i] for i in gone if i in self.row_of)
        left = len(self.rows) - len(doomed)
        holes = [r for r in doomed if r < left]
        movers = [r for r in range(left, len(self.rows)) if r not in set(doomed)]
        for hole, mover in zip(holes, movers):
            self.rows[hole] = self.rows[mover]
        self.rows = self.rows[:left]
        self.row_of = {row[0]: r for r, row in enumerate(self.rows)}
        return len(doomed)

    def state_of(self, rows):
        picked = [self.rows[r] for r in np.asarray(rows).tolist()]
        out = {f"slot{j}": np.array([r[2][j] for r in picked], np.float32).reshape(len(picked), self.slot_widths[j])
               for j in range(self.slot_count)}
        if self.keeps_steps:
            out["steps"] = np.array([r[3] for r in picked], np.int64)
        if self.keeps_last_seen:
            out["last_seen"] = np.array([r[4] for r in picked], np.int64)
        return out

    def ids(self, start=0, count=None):
        end = len(self.rows) if count is None else start + count
        return np.array([row[0] for row in self.rows[start:end]], np.uint64)

    def page(self, start, count):
        rows = self.rows[start:start + count]
        out = {"ids": np.array([r[0] for r in rows], np.uint64),
               "values": np.array([r[1] for r in rows], np.float32).reshape(len(rows), self.dim)}
        for j in range(self.slot_count):
            out[f"slot{j}"] = np.array([r[2][j] for r in rows], np.float32).reshape(len(rows), self.slot_widths[j])
        if self.keeps_steps:
            out["steps"] = np.array([r[3] for r in rows], np.int64)
        if self.keeps_last_seen:
            out["last_seen"] = np.array([r[4] for r in rows], np.int64)
        return out
