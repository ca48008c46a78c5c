"""A RowStore (server/row_store.py) written the slow, obvious way: a dict and one Python call per
row. The oracle for the contract: any store must give the same tables for the same calls."""
from __future__ import annotations

import numpy as np

from paramshard.placement.sparse_hash import initial_rows

F32 = np.float32


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
    def __init__(self, dim, rule, keep_last_seen, count_admissions, **ignored):   # max_rows, capacity
        self.dim, self.rule = dim, rule
        self.slot_count = len(rule.init_slots((1, dim)))
        self.slot_widths = [s.shape[1] for s in rule.init_slots((1, dim))]     # dim, or 1 (per row)
        self.keeps_steps, self.keeps_last_seen = rule.uses_step, keep_last_seen
        self.counting = count_admissions
        self.clear()

    def clear(self):
        self.row_of, self.rows, self.seen = {}, [], {}    # rows: [id, values, slots, steps, last_seen]

    @property
    def num_rows(self):
        return len(self.rows)

    @property
    def nbytes(self):
        per_row = 4 * (self.dim + sum(self.slot_widths)) + 4 * (self.keeps_steps + self.keeps_last_seen) + 8
        return len(self.rows) * per_row + 12 * len(self.seen)

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
            self.rows.append([int(i), np.array(values[k], np.float32), slots, steps, last])
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
            self.rows[r][1] = np.array(v, np.float32)

    def update(self, rows, grads, scale):
        for r, g in zip(rows, grads):
            row = self.rows[r]
            row[3] += 1
            if self.rule.config.kind == "rowwise_adagrad":     # the maths again, not the rule's code
                row[1], acc = rowwise_adagrad(self.rule.config, row[1], g, row[2][0][0], scale)
                row[2] = [acc]
                continue
            param, slots = row[1][None, :].copy(), [s[None, :].copy() for s in row[2]]
            step = np.array([[row[3]]], np.uint32) if self.keeps_steps else 1
            self.rule.apply(param, g[None, :], slots, step, scale=scale)
            row[1], row[2] = param[0], [s[0] for s in slots]

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

    def ids(self):
        return np.array([row[0] for row in self.rows], np.uint64)

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
