"""membership.png: live trainers and servers over time, moves shaded (elastic jobs)."""
from __future__ import annotations

from pathlib import Path

from paramshard.observe.run_records.elastic_view import initial_counts, is_elastic, membership_series, moves
from paramshard.observe.report.plots import _figure, _legend, _save
from paramshard.observe.run_records.run_data import RunData


def plot_membership(run: RunData, path: Path) -> str | None:
    if not is_elastic(run.events):
        return "not an elastic job: no trainer or server joined, left or moved"
    t0 = run.t0 or 0.0
    ends = [r["t"] for group in (*run.trainers.values(), *run.servers.values()) for r in group[-1:]]
    series = membership_series(run.events, initial_counts(run.config), t0, max(ends) if ends else None)
    if not series:
        return "no membership counts were recorded"
    fig, (ax,) = _figure(1, 1, 9, 3.5)
    for role, points in series.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], drawstyle="steps-post", linewidth=2,
                marker=".", label=f"live {role}s")
    for i, move in enumerate(moves(run.events, run.trainers, t0)):
        ax.axvspan(move.started, move.started + move.seconds, color="orange", alpha=0.3,
                   label="rows moving" if i == 0 else None)
    ax.set_xlabel("seconds since the first record")
    ax.set_ylabel("processes")
    ax.set_ylim(bottom=0)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    _legend(ax, len(series) + 1)
    _save(fig, path)
    return None
