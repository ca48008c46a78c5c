"""`paramshard report`'s GEO section (a run with ``geo_round`` records: geo/records.py): the
plots (k over time, the staleness histogram, cumulative bytes on the wire against the
validation AUC); the table is geo_section.py. The figures come from
observe/run_records/geo_view.py; drawing follows plots.py (Agg canvas, never pyplot)."""
from __future__ import annotations

from pathlib import Path

from matplotlib.ticker import ScalarFormatter

from paramshard.observe.report.plots import _figure, _legend, _markers, _save, _staleness_bars
from paramshard.observe.run_records import geo_view
from paramshard.observe.run_records.run_data import RunData


def plot_k(run: RunData, path: Path) -> str | None:
    series = {t: points for t, points in geo_view.k_over_time(run).items() if points}
    if not series:
        return "no GEO round was recorded"
    fig, (ax,) = _figure(1, 1, 9, 4)
    for trainer, points in series.items():
        # A round's k covers the time up to its record (the send's end): "pre" steps.
        ax.step([p[0] for p in points], [p[2] for p in points], where="pre", label=f"trainer {trainer}",
                linewidth=1, **_markers(len(points)))
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlabel("seconds since the first record")
    ax.set_ylabel("k (local steps between sends)")
    ax.grid(alpha=0.3)
    _legend(ax, len(series))
    _save(fig, path)
    return None


def plot_staleness(run: RunData, path: Path) -> str | None:
    histogram = geo_view.staleness_histogram(run)
    if not histogram:
        return "no GEO round recorded its staleness"
    _staleness_bars(histogram, path, "tab:purple", "rounds", "{:.1f} steps",
                    "staleness at the send (local steps the replica was behind the merged values)", "rounds")
    return None


def plot_bytes_vs_metric(run: RunData, path: Path) -> str | None:
    name, points = geo_view.bytes_against_metric(run)
    if not points:
        return "no trainer logged an AUC or a loss"
    fig, (ax,) = _figure(1, 1, 8, 4)
    ax.plot([b / 2**20 for b, _ in points], [v for _, v in points], color="tab:green", linewidth=1,
            **_markers(len(points)))
    ax.set_xlabel("cumulative MiB on the wire (GEO sends, all trainers)")
    ax.set_ylabel(name)
    if name == "loss":
        ax.set_title("no AUC was logged in this run: training loss instead", fontsize="medium")
    ax.grid(alpha=0.3)
    _save(fig, path)
    return None


PLOTS = (
    ("geo_k.png", "GEO: k over time", "Local steps between two sends of each trainer (--geo-k auto adapts it).",
     plot_k),
    ("geo_staleness.png", "GEO: staleness", "Rounds by how many local steps a replica was behind when it sent.",
     plot_staleness),
    ("geo_bytes_auc.png", "GEO: bytes on the wire against validation AUC",
     "Each validation figure at the bytes all trainers had sent and received by then (the loss when no AUC "
     "was logged).", plot_bytes_vs_metric),
)


def plots(run: RunData) -> list:
    """report_files' (file, title, caption, draw) entries: none for a run without GEO rounds."""
    if not geo_view.has_geo(run):
        return []
    return [(file, title, caption, (lambda p, draw=draw: draw(run, p))) for file, title, caption, draw in PLOTS]
