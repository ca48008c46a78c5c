"""Schemas of well-known layouts, for TabularReader and paramshard.models.

``criteo_schema()``: the Criteo display-ads TSV (no header; label, I1..I13
integer counts, C1..C26 hex categories; any field may be empty). Counts go
through the signed log (no statistics needed), missing counts are 0, and each
category is hashed with its column, like any other file's. CriteoReader
stays the fast path for this one layout (numpy over raw bytes, about 8x the
rows per second of the general reader); its ids differ (hex values, not
hashes), so a model trained with one reader is evaluated with the same one.

``libsvm_schema()``: ``label idx:val ...`` lines (labels 0/1 or -1/+1) as one
id field whose bag is the row's features, each id weighted by its value, so
``LogisticRegression`` on it is the sparse logistic regression libsvm data is
made for. Parsed by LibsvmReader (indices are the ids, unhashed).
"""
from __future__ import annotations

from paramshard.specs.schema import Column, Format, Label, Schema

CRITEO_DENSE = tuple(f"I{i}" for i in range(1, 14))
CRITEO_SPARSE = tuple(f"C{i}" for i in range(1, 27))


def criteo_schema() -> Schema:
    names = ["label", *CRITEO_DENSE, *CRITEO_SPARSE]
    return Schema(label=Label("label"),
                  columns=[Column(n, "numeric", transforms=["log"]) for n in CRITEO_DENSE]
                  + [Column(n, "categorical") for n in CRITEO_SPARSE],
                  format=Format(type="tsv", delimiter="\t", header=False, names=names, missing=[""]))


def libsvm_schema() -> Schema:
    return Schema(label=Label("label"), columns=[Column("features", "multi", separator=" ")],
                  format=Format(type="libsvm", header=False, names=["label", "features"], missing=[]))


PRESETS = {"criteo": criteo_schema, "libsvm": libsvm_schema}
