"""Reading tabular data into model inputs: paramshard's TabularReader beside the
code a user writes by hand with pandas, and beside CriteoReader on its one layout.

Rows per second from file to (labels, dense float32, int64 ids) batches of 4096,
one process, one thread:
- paramshard TabularReader with a fitted schema (stable BLAKE2b ids, missing
  indicators, standardize, checks every value, bad lines as path:line);
- pandas by hand: ``read_csv(chunksize=...)``, ``to_numeric``, ``fillna``,
  standardize with precomputed statistics, ``pd.util.hash_array`` per
  categorical column (SipHash, vectorised) with the column's index in the high
  bits; no per-line error reporting;
- CriteoReader (Criteo TSV only: numpy over raw bytes, hex ids, no hashing).

Data: UCI Adult (`paramshard dataset adult`) repeated to 400k rows, and
synthetic Criteo (`paramshard gen-data`) of 200k rows. Rounds are interleaved;
medians of ``--rounds``.

    .venv/bin/python benchmarks/tabular_reader.py [--markdown] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

from paramshard.data import CriteoReader, TabularReader, criteo_schema, fit_schema, infer_schema  # noqa: E402
from paramshard.data.datasets import adult  # noqa: E402
from paramshard.data.synthetic import generate_criteo  # noqa: E402

BATCH = 4096


def by_hand(path: Path, schema, sep: str, header) -> int:
    """What a user writes without a schema reader (the statistics come from the fitted schema)."""
    names = None if header else schema.format.names
    numeric = [c for c in schema.columns if c.kind == "numeric"]
    text = [c for c in schema.columns if c.kind == "categorical"]
    rows = 0
    for chunk in pd.read_csv(path, sep=sep, header=0 if header else None, names=names, chunksize=BATCH,
                             dtype=str, keep_default_na=False, na_values=schema.format.missing):
        label = chunk[schema.label.column]
        y = (label.isin(schema.label.positive) if schema.label.positive else label.astype(float) > 0)
        y = y.to_numpy(np.float32)
        dense = []
        for c in numeric:
            x = pd.to_numeric(chunk[c.name], errors="coerce").to_numpy(np.float64)
            if "log" in c.transforms:
                x = np.sign(x) * np.log1p(np.abs(x))
            if "standardize" in c.transforms:
                x = (x - c.stats["mean"]) / (c.stats["std"] or 1.0)
            dense.append(np.nan_to_num(x).astype(np.float32))
        ids = [(pd.util.hash_array(chunk[c.name].fillna("").to_numpy(object)).astype(np.uint64) >> np.uint64(8))
               | (np.uint64(i) << np.uint64(56)) for i, c in enumerate(text)]
        np.stack(dense, axis=1), np.stack(ids, axis=1).view(np.int64)
        rows += len(y)
    return rows


def tabular(path: Path, schema) -> int:
    return sum(len(b) for b in TabularReader([path], schema, BATCH))


def criteo(path: Path, schema) -> int:
    return sum(len(b) for b in CriteoReader([path], BATCH))


def prepare(work: Path) -> dict:
    train, _ = adult(work / "adult")
    big = work / "adult-400k.csv"
    df = pd.read_csv(train, dtype=str, keep_default_na=False)
    pd.concat([df] * (400_000 // len(df) + 1)).iloc[:400_000].to_csv(big, index=False)
    a_schema = infer_schema(train, label="income")
    for c in a_schema.columns:
        c.bucketize = 0                  # the hand-written peer has no buckets: compare like with like
    a_schema = fit_schema(a_schema, [train])
    c_path = work / "criteo-200k.tsv"
    generate_criteo(c_path, 200_000, seed=0)
    c_schema = criteo_schema()
    return {"adult (15 columns, 400k rows)": (big, a_schema, ",", True, ("tabular", "hand")),
            "criteo synthetic (40 columns, 200k rows)": (c_path, c_schema, "\t", False, ("tabular", "hand", "criteo"))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-tabular-"))
    cases = prepare(work)
    runners = {"tabular": ("paramshard TabularReader", lambda path, s, sep, h: tabular(path, s)),
               "hand": ("pandas by hand", lambda path, s, sep, h: by_hand(path, s, sep, h)),
               "criteo": ("paramshard CriteoReader", lambda path, s, sep, h: criteo(path, s))}
    times: dict = {}
    for _ in range(args.rounds):                       # interleaved: drift hits every candidate alike
        for data, (path, schema, sep, header, which) in cases.items():
            for key in which:
                start = time.perf_counter()
                rows = runners[key][1](path, schema, sep, header)
                times.setdefault((data, key), []).append(rows / (time.perf_counter() - start))
    table = []
    for data, (_, _, _, _, which) in cases.items():
        peer = C.median(times[(data, "hand")])
        for key in which:
            rates = times[(data, key)]
            table.append([data, runners[key][0], f"{C.median(rates):,.0f}", f"{min(rates):,.0f}-{max(rates):,.0f}",
                          f"{C.median(rates) / peer:.2f}x"])
    C.emit(args.markdown, [("rows per second, file to batches", ["data", "reader", "rows/s (median)", "range",
                                                                 "vs pandas by hand"], table,
                            [False, False, True, True, True])],
           notes=[C.machine_note() + f"; {args.rounds} interleaved rounds, batch {BATCH}"])


if __name__ == "__main__":
    main()
