"""The PNG plots of `paramshard report`, drawn from parsed metric records
(paramshard.observe.run_records.records).

Each ``plot_*`` function takes records and a path and returns None when it wrote the
PNG, or a sentence saying why it did not (no such data in this run: e.g. no staleness
in a sync run), which the page shows in the plot's place.

Figures are made with ``matplotlib.figure.Figure`` on the Agg canvas, never through
pyplot: no window can open, and a notebook that imports this keeps its own backend
(``matplotlib.use("Agg")`` would switch it for the whole process).
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Callable

import numpy as np

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

MAX_METRIC_PANELS = 6    # user metrics beyond these are left out of loss.png: the panels would get too small
MAX_LEGEND = 10          # more lines than this and a legend hides the plot
DPI = 100
PHASE_ORDER = ("pull", "compute", "push")


def _number(value) -> float | None:
    """A plottable value, or None (missing, None, a string, a bool, NaN or inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _metric(record: dict, name: str):
    metrics = record.get("metrics")
    return metrics.get(name) if isinstance(metrics, dict) else None


def _figure(rows: int, cols: int, width: float, height: float):
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def _save(fig: Figure, path: Path) -> None:
    # A temporary name then one rename: a browser reloading the page never gets half a PNG.
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)


def _legend(ax, count: int) -> None:
    if 1 < count <= MAX_LEGEND:
        ax.legend(fontsize="small")


def _markers(count: int) -> dict:
    """A line of a few points shows its points: one point alone draws no line at all."""
    return {"marker": "o" if count == 1 else "."} if count < 30 else {}


def plot_loss(trainers: dict[int, list[dict]], path: Path) -> str | None:
    """Loss per trainer over steps, plus a panel for each of the first user metrics: every
    value logged, at the step it was logged (run_data.logged_series)."""
    from paramshard.observe.run_records.run_data import logged_series

    logged = {trainer: logged_series(records) for trainer, records in trainers.items()}
    seen: dict[str, None] = {}   # an ordered set: the panels come in the order metrics first appear
    for series in logged.values():
        for name, points in series.items():
            # the loss has its own panel, from the records (every step's, averaged)
            if name != "loss" and name not in seen and any(_number(v) is not None for _, _, v in points):
                seen[name] = None
    metric_names = list(seen)
    has_loss = any(_number(r.get("loss")) is not None for records in trainers.values() for r in records)

    def loss_of(t: int) -> list[tuple[object, object]]:
        return [(r.get("step"), r.get("loss")) for r in trainers[t]]

    def metric_of(name: str) -> Callable[[int], list[tuple[object, object]]]:
        return lambda t: [(s, v) for s, _, v in logged[t].get(name, ())]

    # (title, trainer -> its [(step, value)])
    panels: list[tuple[str, Callable[[int], list[tuple[object, object]]]]] = [("loss", loss_of)] if has_loss else []
    panels += [(name, metric_of(name)) for name in metric_names[:MAX_METRIC_PANELS]]
    if not panels:
        return ("no loss or metrics were logged (pass the loss to trainer.step(loss), "
                "or log them with trainer.log(loss=..., name=value))")
    cols = min(len(panels), 3)
    rows = math.ceil(len(panels) / cols)
    fig, axes = _figure(rows, cols, 4.5 * cols, 3.2 * rows)
    for ax, (name, values) in zip(axes, panels):
        for trainer in trainers:
            numbers = [(_number(s), _number(v)) for s, v in values(trainer)]
            plotted = [(s, v) for s, v in numbers if s is not None and v is not None]
            if plotted:
                ax.plot(*zip(*plotted), label=f"trainer {trainer}", linewidth=1, **_markers(len(plotted)))
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        _legend(ax, len(trainers))
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    if len(metric_names) > MAX_METRIC_PANELS:
        fig.suptitle(f"first {MAX_METRIC_PANELS} of {len(metric_names)} metrics", fontsize="small")
    _save(fig, path)
    return None


def _step_hold(records: list[dict]) -> tuple[list[float], list[float]]:
    """(times, rates) of one trainer's samples_per_s: a record's rate covers the time
    since the trainer's previous record."""
    points = [(r["t"], _number(r.get("samples_per_s"))) for r in records]
    return [t for t, v in points if v is not None], [v for _, v in points if v is not None]


def _total_rate(series: list[tuple[list[float], list[float]]], grid: np.ndarray) -> np.ndarray:
    """Sum over trainers of the rate each reported for the interval that holds t
    (0 before a trainer's first and after its last record: it was not running yet / any more)."""
    total = np.zeros(len(grid))
    for times, rates in series:
        times_a, rates_a = np.asarray(times), np.asarray(rates)
        covering = np.minimum(np.searchsorted(times_a, grid, side="left"), len(times_a) - 1)
        running = (grid >= times_a[0]) & (grid <= times_a[-1])
        total += np.where(running, rates_a[covering], 0.0)
    return total


def plot_throughput(trainers: dict[int, list[dict]], t0: float, path: Path) -> str | None:
    """samples/s of each trainer and of all of them, over time since the first record."""
    series = {trainer: _step_hold(records) for trainer, records in trainers.items()}
    series = {k: v for k, v in series.items() if v[0]}
    if not series:
        return "no trainer reported samples/s"
    fig, (ax,) = _figure(1, 1, 9, 4)
    for trainer, (times, rates) in series.items():
        ax.plot([t - t0 for t in times], rates, label=f"trainer {trainer}", linewidth=1, drawstyle="steps-pre",
                **_markers(len(times)))
    if len(series) > 1:
        grid = np.unique(np.concatenate([times for times, _ in series.values()]))
        ax.plot(grid - t0, _total_rate(list(series.values()), grid), label="total",
                color="black", linewidth=2, drawstyle="steps-pre")
    ax.set_xlabel("seconds since the first record")
    ax.set_ylabel("samples/s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    _legend(ax, len(series) + (len(series) > 1))
    _save(fig, path)
    return None


def _ratio_title(name: str, values: list[float]) -> str:
    mean = sum(values) / len(values)
    return f"{name}: max/mean {max(values) / mean:.3f}" if mean > 0 else f"{name}: max/mean n/a (all 0)"


def plot_server_load(servers: dict[int, list[dict]], path: Path) -> str | None:
    """Bars of what each server holds and served, from its last record; a max/mean ratio
    well above 1 means one server is the bottleneck."""
    last = {server: records[-1] for server, records in servers.items() if records}
    if not last:
        return "no server records (the servers did not report before the run ended)"
    ids = list(last)
    labels = [str(s) for s in ids]
    panels = [
        ("dense elements", [_number(last[s].get("elements")) or 0.0 for s in ids]),
        ("sparse rows", [_number(last[s].get("rows")) or 0.0 for s in ids]),
        ("requests", [_number(last[s].get("requests")) or 0.0 for s in ids]),
        ("MiB in + out", [((_number(last[s].get("bytes_in")) or 0.0) + (_number(last[s].get("bytes_out")) or 0.0))
                          / 2**20 for s in ids]),
    ]
    fig, axes = _figure(2, 2, 9, 6)
    for ax, (name, values) in zip(axes, panels):
        ax.bar(labels, values, color="tab:blue")
        ax.set_title(_ratio_title(name, values), fontsize="medium")
        ax.set_xlabel("server")
        ax.grid(axis="y", alpha=0.3)
    _save(fig, path)
    return None


def _weighted_phases(records: list[dict]) -> dict[str, float]:
    """Mean seconds per step of each phase over the whole run: each record's means are
    weighted by the steps it covers, so a record after a slow, short stretch counts less."""
    sums: dict[str, float] = {}
    weight_sum = 0.0
    previous_step = 0.0
    for r in records:
        phases = r.get("phases")
        step = _number(r.get("step"))
        if step is None:
            continue
        weight = max(step - previous_step, 0.0)
        previous_step = step
        if not isinstance(phases, dict) or weight == 0:
            continue
        for name, value in phases.items():
            seconds = _number(value)
            if seconds is not None:
                sums[name] = sums.get(name, 0.0) + seconds * weight
        weight_sum += weight
    return {name: s / weight_sum for name, s in sums.items()} if weight_sum else {}


def plot_phases(trainers: dict[int, list[dict]], path: Path) -> str | None:
    """Stacked bars: where a trainer's step time goes (pull, compute, push)."""
    means = {trainer: _weighted_phases(records) for trainer, records in trainers.items()}
    means = {k: v for k, v in means.items() if v}
    if not means:
        return "no trainer reported step phases"
    names = [p for p in PHASE_ORDER if any(p in m for m in means.values())]
    names += sorted({p for m in means.values() for p in m} - set(names))
    ticks = [str(t) for t in means]
    fig, (ax,) = _figure(1, 1, max(6.0, min(14.0, 2 + 0.5 * len(ticks))), 4)
    bottom = [0.0] * len(ticks)
    for name in names:
        heights = [m.get(name, 0.0) * 1000 for m in means.values()]
        ax.bar(ticks, heights, bottom=bottom, label=name)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_xlabel("trainer")
    ax.set_ylabel("ms per step")
    ax.grid(axis="y", alpha=0.3)
    # Beside the bars, not on them; top to bottom in the order they are stacked.
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    _save(fig, path)
    return None


def staleness_histogram(servers: dict[int, list[dict]], summary: dict | None = None) -> dict[int, int]:
    """Sum of each server's last cumulative histogram; the summary's when no server record has one."""
    total: dict[int, int] = {}
    for records in servers.values():
        last: dict = next((r["staleness"] for r in reversed(records) if isinstance(r.get("staleness"), dict)), {})
        for k, n in last.items():
            if str(k).isdigit() and _number(n):
                total[int(k)] = total.get(int(k), 0) + int(n)
    if not total and isinstance(summary, dict) and isinstance(summary.get("staleness"), dict):
        histogram = summary["staleness"].get("histogram")
        if isinstance(histogram, dict):
            total = {int(k): int(n) for k, n in histogram.items() if str(k).isdigit() and _number(n)}
    return {k: n for k, n in sorted(total.items()) if n > 0}


def plot_staleness(histogram: dict[int, int], path: Path) -> str | None:
    if not histogram:
        return "no async push staleness was recorded (sync runs have none)"
    _staleness_bars(histogram, path, "tab:orange", "async pushes", "{:.2f}",
                    "staleness (updates applied between the read and the push)", "pushes")
    return None


def _staleness_bars(histogram: dict[int, int], path: Path, color: str, what: str, mean_format: str, xlabel: str,
                    ylabel: str) -> None:
    """A staleness histogram as bars (async pushes here, GEO rounds in geo_plots.py), titled with
    its count, mean and max."""
    fig, (ax,) = _figure(1, 1, 7, 4)
    ax.bar(list(histogram), list(histogram.values()), color=color, width=0.8)
    total = sum(histogram.values())
    mean = sum(k * n for k, n in histogram.items()) / total
    ax.set_title(f"{total:,} {what}: mean staleness {mean_format.format(mean)}, max {max(histogram)}",
                 fontsize="medium")
    ax.set_xlabel(xlabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)


def plot_requests(servers: dict[int, list[dict]], t0: float, path: Path) -> str | None:
    """Requests/s each server handled, over time since the first record."""
    series = {}
    for server, records in servers.items():
        points = [(r["t"] - t0, _number(r.get("requests_per_s"))) for r in records]
        # A negative rate is a counter that started again (a run directory from before restarts
        # were handled: observe/run_records/counter_carry.py): unknown, not a drop below zero.
        points = [(t, v) for t, v in points if v is not None and v >= 0]
        if points:
            series[server] = points
    if not series:
        return "no server reported requests/s"
    fig, (ax,) = _figure(1, 1, 9, 4)
    for server, points in series.items():
        ax.plot(*zip(*points), label=f"server {server}", linewidth=1, **_markers(len(points)))
    ax.set_xlabel("seconds since the first record")
    ax.set_ylabel("requests/s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    _legend(ax, len(series))
    _save(fig, path)
    return None
