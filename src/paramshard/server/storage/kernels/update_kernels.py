"""The update rules of update_rules.rules as compiled kernels, fused with the gather and scatter.

The numpy store gathers the rows a push updates into temporaries, runs the
rule over them (a temporary per arithmetic step) and scatters them back; here
each row is updated where it lives, one element at a time, with nothing of
the batch's size allocated. Half rows (uint16 bits, kernels/half.py) are loaded as
float32 and the new value rounded when stored: load_value/store_value are plain
indexing for float32 rows, so those kernels are what they were. Every float32 operation is the one numpy does, in
the same order, with the same float64 per-row factors (Adagrad's decayed rate,
Adam's bias corrections), and no fast-math: the results are bit-identical to
the numpy rules (tests/unit/server/storage/kernels/test_kernels.py). Rows are taken in groups, each
group's rows first read into cache together (row_kernels.py says why). ``rule_kernel`` picks the kernel
of a rule and binds its settings.
"""
from __future__ import annotations

from typing import Callable

import numba
import numpy as np

from paramshard.optim import Adagrad, Adam
from paramshard.update_rules import Rule
from paramshard.server.storage.kernels.half import load_value, row_noise, store_value
from paramshard.server.storage.kernels.row_kernels import GROUP, prefetch

U1 = np.uint32(1)
NO_KEYS = np.zeros(0, np.uint64)     # float32 rows and nearest rounding read no ids
ZERO = np.uint64(0)


@numba.njit(cache=True, error_model="numpy", inline="always")
def _grad(g, p, scale, scaled, wd, decays):
    """Rule._grad: scale * grad (+ weight decay), element by element."""
    if scaled:
        g = g * scale
    if decays:
        g = g + wd * p
    return g


@numba.njit(cache=True, error_model="numpy")
def sgd_kernel(values, keys, rows, grads, lr, lr_scaled, scale, scaled, wd, decays, fmt, salt, vkey):
    touched = 0.0
    for i in range(len(rows)):
        if i % GROUP == 0:
            touched += prefetch(values, rows, i, min(len(rows), i + GROUP))
        r = rows[i]
        noise = row_noise(values, keys, r, fmt, salt, vkey)
        for j in range(values.shape[1]):
            if not decays:
                store_value(values, r, j, load_value(values, r, j, fmt) - grads[i, j] * lr_scaled, fmt, noise)
            else:
                g = _grad(grads[i, j], load_value(values, r, j, fmt), scale, scaled, wd, decays)
                store_value(values, r, j, load_value(values, r, j, fmt) - lr * g, fmt, noise)
    return touched


@numba.njit(cache=True, error_model="numpy")
def momentum_kernel(values, keys, buf, rows, grads, lr, momentum, nesterov, scale, scaled, wd, decays, fmt, salt,
                    vkey):
    touched = 0.0
    for i in range(len(rows)):
        if i % GROUP == 0:
            end = min(len(rows), i + GROUP)
            touched += prefetch(values, rows, i, end) + prefetch(buf, rows, i, end)
        r = rows[i]
        noise = row_noise(values, keys, r, fmt, salt, vkey)
        for j in range(values.shape[1]):
            g = _grad(grads[i, j], load_value(values, r, j, fmt), scale, scaled, wd, decays)
            b = buf[r, j] * momentum
            b = b + g
            buf[r, j] = b
            step = g + momentum * b if nesterov else b
            store_value(values, r, j, load_value(values, r, j, fmt) - lr * step, fmt, noise)
    return touched


@numba.njit(cache=True, error_model="numpy")
def adagrad_kernel(values, keys, acc, steps, rows, grads, lr, lr_decay, fixed_rate, counts, eps,
                   scale, scaled, wd, decays, fmt, salt, vkey):
    touched = 0.0
    for i in range(len(rows)):
        if i % GROUP == 0:
            end = min(len(rows), i + GROUP)
            touched += prefetch(values, rows, i, end) + prefetch(acc, rows, i, end)
        r = rows[i]
        rate = fixed_rate
        if counts:
            steps[r] = steps[r] + U1
            rate = np.float32(lr / (1.0 + (np.float64(steps[r]) - 1.0) * lr_decay))
        noise = row_noise(values, keys, r, fmt, salt, vkey)
        for j in range(values.shape[1]):
            g = _grad(grads[i, j], load_value(values, r, j, fmt), scale, scaled, wd, decays)
            a = acc[r, j] + g * g
            acc[r, j] = a
            store_value(values, r, j, load_value(values, r, j, fmt) - rate * g / (np.sqrt(a) + eps), fmt, noise)
    return touched


@numba.njit(cache=True, error_model="numpy")
def adam_kernel(values, keys, m, v, steps, rows, grads, lr, beta1, beta2, b1, b2, c1, c2, eps,
                scale, scaled, wd, decays, fmt, salt, vkey):
    touched = 0.0
    for i in range(len(rows)):
        if i % GROUP == 0:
            end = min(len(rows), i + GROUP)
            touched += prefetch(values, rows, i, end) + prefetch(m, rows, i, end) + prefetch(v, rows, i, end)
        r = rows[i]
        steps[r] = steps[r] + U1
        step = np.float64(steps[r])
        bias1 = 1.0 - beta1 ** step
        bias2_sqrt = np.float32(np.sqrt(1.0 - beta2 ** step))
        rate = np.float32(lr / bias1)
        noise = row_noise(values, keys, r, fmt, salt, vkey)
        for j in range(values.shape[1]):
            g = _grad(grads[i, j], load_value(values, r, j, fmt), scale, scaled, wd, decays)
            mm = m[r, j] * b1
            mm = mm + c1 * g
            m[r, j] = mm
            vv = v[r, j] * b2
            vv = vv + c2 * (g * g)
            v[r, j] = vv
            denom = np.sqrt(vv) / bias2_sqrt + eps
            store_value(values, r, j, load_value(values, r, j, fmt) - rate * mm / denom, fmt, noise)
    return touched


@numba.njit(cache=True, error_model="numpy")
def ftrl_kernel(values, keys, z, n, rows, grads, lr, beta, l1, l2, scale, scaled, wd, decays, fmt, salt, vkey):
    touched = 0.0
    for i in range(len(rows)):
        if i % GROUP == 0:
            end = min(len(rows), i + GROUP)
            touched += prefetch(values, rows, i, end) + prefetch(z, rows, i, end) + prefetch(n, rows, i, end)
        r = rows[i]
        noise = row_noise(values, keys, r, fmt, salt, vkey)
        for j in range(values.shape[1]):
            p = load_value(values, r, j, fmt)
            # As FTRLRule: the weight decay applies only with a scale (a sync step's average).
            g = _grad(grads[i, j], p, scale, scaled, wd, decays) if scaled else grads[i, j]
            old_n = n[r, j]
            new_n = old_n + g * g
            sigma = (np.sqrt(new_n) - np.sqrt(old_n)) / lr
            zz = z[r, j] + (g - sigma * p)
            z[r, j] = zz
            n[r, j] = new_n
            denom = (beta + np.sqrt(new_n)) / lr + l2
            shrunk = -(zz - np.sign(zz) * l1) / denom
            store_value(values, r, j, np.float32(0.0) if np.abs(zz) <= l1 else shrunk, fmt, noise)
    return touched


@numba.njit(cache=True, error_model="numpy")
def rowwise_adagrad_kernel(values, keys, acc, rows, grads, lr, eps, width, scale, scaled, wd, decays, fmt, salt,
                           vkey):
    touched = 0.0
    dim = values.shape[1]
    for i in range(len(rows)):
        if i % GROUP == 0:
            end = min(len(rows), i + GROUP)
            touched += prefetch(values, rows, i, end) + prefetch(acc, rows, i, end)
        r = rows[i]
        # The order RowWiseAdagradRule documents: squares summed left to right in float32.
        g0 = _grad(grads[i, 0], load_value(values, r, 0, fmt), scale, scaled, wd, decays)
        total = g0 * g0
        for j in range(1, dim):
            g = _grad(grads[i, j], load_value(values, r, j, fmt), scale, scaled, wd, decays)
            total = total + g * g
        a = acc[r, 0] + total / width
        acc[r, 0] = a
        multiplier = lr / (np.sqrt(a) + eps)
        noise = row_noise(values, keys, r, fmt, salt, vkey)
        for j in range(dim):
            g = _grad(grads[i, j], load_value(values, r, j, fmt), scale, scaled, wd, decays)
            store_value(values, r, j, load_value(values, r, j, fmt) - multiplier * g, fmt, noise)
    return touched


def rule_kernel(rule: Rule) -> Callable[..., None]:
    """``update(values, slots, steps, rows, grads, scale, keys=, fmt=, salt=, vkey=)`` applying
    ``rule`` in place. ``values``: float32 rows, or half rows as uint16 bits (kernels/half.py) in
    format ``fmt``; ``keys`` (the rows' ids), ``salt`` and ``vkey`` feed stochastic rounding's
    random words (row_formats.py: round_salt(seed), version_key(version))."""
    c, f32 = rule.config, np.float32
    kind, wd = c.kind, f32(c.weight_decay)
    decays = bool(c.weight_decay)

    def common(scale: float):
        return f32(scale), scale != 1.0, wd, decays

    if kind == "sgd":
        def update(values, slots, steps, rows, grads, scale, keys=NO_KEYS, fmt=0, salt=ZERO, vkey=ZERO):
            sgd_kernel(values, keys, rows, grads, f32(c.lr), f32(c.lr * scale), *common(scale), fmt, salt, vkey)
    elif kind == "momentum":
        def update(values, slots, steps, rows, grads, scale, keys=NO_KEYS, fmt=0, salt=ZERO, vkey=ZERO):
            momentum_kernel(values, keys, slots[0], rows, grads, f32(c.lr), f32(c.momentum), c.nesterov,
                            *common(scale), fmt, salt, vkey)
    elif kind == "adagrad":
        assert isinstance(c, Adagrad), f"kind 'adagrad' is optim.Adagrad's, not {type(c).__name__}'s"
        # Without lr_decay the rule's rate is lr / (1 + 0 * lr_decay), cast once.
        fixed = f32(np.float64(c.lr) / (1 + (np.float64(1) - 1) * c.lr_decay))
        no_steps = np.zeros(0, np.uint32)

        def update(values, slots, steps, rows, grads, scale, keys=NO_KEYS, fmt=0, salt=ZERO, vkey=ZERO):
            adagrad_kernel(values, keys, slots[0], steps if steps is not None else no_steps, rows, grads,
                           float(c.lr), float(c.lr_decay), fixed, steps is not None, f32(c.eps), *common(scale),
                           fmt, salt, vkey)
    elif kind == "adam":
        assert isinstance(c, Adam), f"kind 'adam' is optim.Adam's, not {type(c).__name__}'s"
        b1, b2 = c.betas

        def update(values, slots, steps, rows, grads, scale, keys=NO_KEYS, fmt=0, salt=ZERO, vkey=ZERO):
            adam_kernel(values, keys, slots[0], slots[1], steps, rows, grads, float(c.lr), float(b1), float(b2),
                        f32(b1), f32(b2), f32(1 - b1), f32(1 - b2), f32(c.eps), *common(scale), fmt, salt, vkey)
    elif kind == "ftrl":
        def update(values, slots, steps, rows, grads, scale, keys=NO_KEYS, fmt=0, salt=ZERO, vkey=ZERO):
            ftrl_kernel(values, keys, slots[0], slots[1], rows, grads, f32(c.lr), f32(c.beta), f32(c.l1), f32(c.l2),
                        *common(scale), fmt, salt, vkey)
    elif kind == "rowwise_adagrad":
        def update(values, slots, steps, rows, grads, scale, keys=NO_KEYS, fmt=0, salt=ZERO, vkey=ZERO):
            rowwise_adagrad_kernel(values, keys, slots[0], rows, grads, f32(c.lr), f32(c.eps),
                                   f32(values.shape[1]), *common(scale), fmt, salt, vkey)
    else:
        raise NotImplementedError(f"no compiled kernel for the {kind!r} rule")
    return update
