"""``schema infer --sequence SEQ:CAND``: mark a bag column as a behaviour sequence of a
categorical column (``hist_item_ids:item_id``), which DIN (models/din.py) attends over.

The sequence column becomes ``kind: multi`` with ``sequence_of: CAND`` (a text column the
guess took for one category per cell is split on ``|``; a Parquet list column stays a list)
and CAND becomes categorical whatever the guess (integer item ids look like numbers, and an
id unique per row in the sample looks like a row id): the two share CAND's id space, so an
item has the same table rows in both (specs/schema.py, data/features/encode.py).
"""
from __future__ import annotations

from paramshard.errors import ConfigError
from paramshard.data.features.names import did_you_mean
from paramshard.specs.schema import Column


def sequence_items(items) -> dict[str, str]:
    """{sequence column: candidate column} from "SEQ:CAND" items (a list, or one string)."""
    items = [items] if isinstance(items, str) else list(items or ())
    out: dict[str, str] = {}
    for item in items:
        for part in (p for p in item.split(",") if p.strip()):
            seq, colon, cand = (t.strip() for t in part.partition(":"))
            if not colon or not seq or not cand or seq == cand:
                raise ConfigError(f"--sequence {part!r}: expected SEQUENCE:CANDIDATE, two columns, e.g. "
                                  f"hist_item_ids:item_id (the history of items, the item to score)")
            out[seq] = cand
    return out


def apply_sequences(columns: list[Column], pairs: dict[str, str], names: list[str], labels: list[str],
                    forced: dict[str, str]) -> list[Column]:
    """``columns`` with each pair's sequence made a multi ``sequence_of`` its candidate, and the
    candidate categorical; ConfigError for a name not in the file, the label, or a kind the
    user forced that contradicts the pair (``forced``: --categorical / --numeric / ... kinds)."""
    by_name = {c.name: i for i, c in enumerate(columns)}
    out = list(columns)
    for seq, cand in pairs.items():
        for n in (seq, cand):
            if n not in names:
                raise ConfigError(f"--sequence {seq}:{cand}: no column {n!r}{did_you_mean(n, names)} "
                                  f"(columns: {', '.join(names)})")
            if n in labels:
                raise ConfigError(f"--sequence {seq}:{cand}: {n!r} is a label column, not a feature")
        if cand in pairs:
            raise ConfigError(f"--sequence {seq}:{cand}: {cand!r} is itself a sequence; the candidate is the "
                              f"single-valued column (the item to score)")
        if forced.get(seq, "multi").partition(":")[0] != "multi" or forced.get(cand, "categorical") != "categorical":
            raise ConfigError(f"--sequence {seq}:{cand}: {seq} must be a bag (multi) and {cand} a category; "
                              f"the other flags made them {forced.get(seq, 'as guessed')} and "
                              f"{forced.get(cand, 'as guessed')}")
        col = out[by_name[seq]]
        note = f"--sequence {seq}:{cand}: a behaviour sequence (oldest first) in {cand}'s id space"
        if col.kind == "multi":
            out[by_name[seq]] = Column(seq, "multi", separator=col.separator, list_column=col.list_column,
                                       sequence_of=cand, note=f"{note}; {col.note}" if col.note else note)
        else:
            out[by_name[seq]] = Column(seq, "multi", sequence_of=cand, note=f"{note}; split on '|' "
                                                                             f"(the guess was {col.kind})")
        target = out[by_name[cand]]
        if target.kind != "categorical":
            out[by_name[cand]] = Column(cand, "categorical", note=f"--sequence {seq}:{cand}: the candidate, "
                                                                  f"a category (the guess was {target.kind})")
    return out
