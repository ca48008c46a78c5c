"""Schemas of well-known layouts, for TabularReader and paramshard.models.

``criteo_schema()``: the Criteo display-ads TSV (no header; label, I1..I13
integer counts, C1..C26 hex categories; any field may be empty). Counts go
through the signed log (no statistics needed), missing counts are 0, and each
category is hashed with its column, like any other file's. CriteoReader
stays the fast path for this one layout (numpy over raw bytes, about 4x the
rows per second of the general reader); its ids differ (hex values, not
hashes), so a model trained with one reader is evaluated with the same one.
"""
from __future__ import annotations

from .schema import Column, Format, Label, Schema

CRITEO_DENSE = tuple(f"I{i}" for i in range(1, 14))
CRITEO_SPARSE = tuple(f"C{i}" for i in range(1, 27))


def criteo_schema() -> Schema:
    names = ["label", *CRITEO_DENSE, *CRITEO_SPARSE]
    return Schema(label=Label("label"),
                  columns=[Column(n, "numeric", transforms=["log"]) for n in CRITEO_DENSE]
                  + [Column(n, "categorical") for n in CRITEO_SPARSE],
                  format=Format(type="tsv", delimiter="\t", header=False, names=names, missing=[""]))


PRESETS = {"criteo": criteo_schema}
