"""The 8-bytes-per-uint64 field parsers against Python's int() and float()."""
import random

import numpy as np

from paramshard.data.readers._ascii8 import Windows, parse_decimal, parse_float, parse_hex, parse_uint


def fields(texts):
    """One buffer of tab-separated fields -> (buffer, byte array, windows, starts, lens)."""
    buf = "\t".join(texts).encode() + b"\n"
    lens = np.array([len(t.encode()) for t in texts])
    starts = np.r_[0, np.cumsum(lens + 1)[:-1]]
    return buf, np.frombuffer(buf, np.uint8), Windows(buf), starts, lens


def test_hex_and_decimal_up_to_8_digits():
    rng = random.Random(0)
    texts = [f"{rng.getrandbits(4 * n):0{n}x}" for n in range(1, 9) for _ in range(30)]
    texts += ["ABCDEF", "aBc", "", "0", "g", "12 4", "-1", "1\u00e9"]
    _, _, win, starts, lens = fields(texts)
    got, ok = parse_hex(win.at(starts), lens)
    for t, g, v in zip(texts, got, ok):
        valid = all(c in "0123456789abcdefABCDEF" for c in t)
        assert v == valid, t
        if valid:
            assert int(g) == (int(t, 16) if t else 0), t
    dec = [str(rng.randrange(10**n)).zfill(n) for n in range(1, 9)] + ["", "12a", "1.5", "+1", ":", "/"]
    _, _, win, starts, lens = fields(dec)
    got, ok = parse_decimal(win.at(starts), lens)
    assert ok.tolist() == [t.isdigit() or t == "" for t in dec]
    assert [int(g) for g, v in zip(got, ok) if v] == [int(t) if t else 0 for t in dec if t.isdigit() or t == ""]


def test_uint_covers_uint64_exactly():
    rng = random.Random(1)
    texts = [str(rng.getrandbits(64)) for _ in range(200)] + [str(rng.randrange(10**n)) for n in range(1, 21)]
    texts += ["18446744073709551615", "18446744073709551616", "18446745000000000000", "99999999999999999999",
              "00000000000000000000001", "", "12345678901234x", "1" * 21]
    _, _, win, starts, lens = fields(texts)
    got, ok = parse_uint(win, starts, lens)
    for t, g, v in zip(texts, got, ok):
        valid = t.isdigit() and len(t) <= 20 and int(t) < 2**64
        assert v == valid, t
        if valid:
            assert int(g) == int(t), t


def test_float_equals_python_float_for_plain_decimals():
    rng = random.Random(2)
    texts = [f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 9)}f}" for _ in range(500)]
    texts += ["0", "-0", "+3", ".5", "-.25", "7.", "000123.4500", "123456789012345", "0.00000000000001"]
    not_plain = ["1e5", "nan", "inf", "1.2.3", ".", "-", "+", "1234567890123456", "1_0", "--1", "1.5x"]
    _, a, win, starts, lens = fields(texts + not_plain)
    got, plain = parse_float(a, win, starts, lens)
    assert plain.tolist() == [True] * len(texts) + [False] * len(not_plain)
    np.testing.assert_array_equal(got[:len(texts)], [float(t) for t in texts])
    assert np.signbit(got[texts.index("-0")])
