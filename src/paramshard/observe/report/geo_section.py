"""`paramshard report`'s GEO table on index.html (a run with ``geo_round`` records:
geo/records.py): each trainer's rounds, k and wire share, the bytes on the wire in total and
per sample. No matplotlib here: the plots are geo_plots.py."""
from __future__ import annotations

from paramshard.observe.run_records import geo_view
from paramshard.observe.run_records.run_data import RunData


def html_section(run: RunData, table, escape) -> str:
    """The GEO table for index.html (``table``, ``escape``: html.py's), "" for a run without rounds."""
    if not geo_view.has_geo(run):
        return ""
    rows = [[t.trainer, t.rounds, t.steps, t.first_k, t.last_k, f"{t.min_k}–{t.max_k}", f"{t.bytes / 2**20:,.2f}",
             "—" if t.wire_share is None else f"{t.wire_share:.1%}"] for t in geo_view.per_trainer(run)]
    total, per_sample = geo_view.bytes_total(run), geo_view.bytes_per_sample(run)
    histogram = geo_view.staleness_histogram(run)
    text = (f"<p>Bytes on the wire (GEO sends, both ways): {escape(f'{total / 2**20:,.2f}')} MiB"
            + (f", {escape(f'{per_sample:,.1f}')} bytes per sample" if per_sample is not None else "")
            + (f"; staleness at most {escape(max(histogram))} local steps" if histogram else "") + ".</p>\n")
    return "<h2>GEO rounds</h2>\n" + text + table(
        ["trainer", "rounds", "steps", "first k", "last k", "k range", "MiB on the wire", "wire share of time"],
        rows, numeric={0, 1, 2, 3, 4, 6, 7})


def geo_lines(run: RunData) -> list[str]:
    """What `paramshard report` prints of a GEO run: each trainer's k and the bytes; [] without rounds."""
    if not geo_view.has_geo(run):
        return []
    total, per_sample = geo_view.bytes_total(run), geo_view.bytes_per_sample(run)
    histogram = geo_view.staleness_histogram(run)
    lines = [f"GEO: {total / 2**20:,.2f} MiB on the wire" + (f" ({per_sample:,.1f} bytes per sample)"
                                                            if per_sample is not None else "")
             + (f", staleness at most {max(histogram)} steps" if histogram else "")]
    lines += [f"  trainer {t.trainer}: {t.rounds:,} rounds, k {t.first_k} -> {t.last_k} (range {t.min_k}-{t.max_k})"
              + ("" if t.wire_share is None else f", wire {t.wire_share:.0%} of its time")
              for t in geo_view.per_trainer(run)]
    return lines
