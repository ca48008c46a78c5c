"""Writers of the files a DirectoryStream tails, as a live writer appends them."""
from __future__ import annotations

import json
import os

import pandas as pd


def append(path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def csv_rows(ids, header: bool = False) -> str:
    return ("id,label,city\n" if header else "") + "".join(f"{i},{i % 2},c{i % 7}\n" for i in ids)


def jsonl_rows(ids) -> str:
    return "".join(json.dumps({"id": i, "label": i % 2, "ts": 1000.0 + i}) + "\n" for i in ids)


def write_parquet(directory, name: str, ids) -> None:
    """As a writer does: under a hidden name, then renamed into place."""
    tmp = os.path.join(directory, "." + name)
    pd.DataFrame({"id": list(ids), "label": [i % 2 for i in ids]}).to_parquet(tmp)
    os.rename(tmp, os.path.join(directory, name))


def ids_of(batch) -> list[int]:
    return [int(i) for i in batch.records["id"]] if batch is not None else []


def drain(stream, batch: int = 1000) -> list[int]:
    """Every record the stream has now (no waiting)."""
    out = []
    while (got := stream.poll(batch, 0)) is not None:
        out += ids_of(got)
    return out
