"""`paramshard report`'s files: read a run directory, draw its plots and write
index.html next to them (by default in RUN_DIR/report/)."""
from __future__ import annotations

from pathlib import Path

from paramshard.errors import ConfigError
from paramshard.observe.report.html import PlotEntry, write_index
from paramshard.observe.run_records.run_data import RunData, load_run


def _plots(run: RunData):
    """(file, title, caption, draw(path) -> skip reason or None) for each plot, in page order."""
    from paramshard.observe.report import plots   # matplotlib is imported only when a report is drawn
    from paramshard.observe.run_records.elastic_view import is_elastic
    from paramshard.observe.report.membership_plot import plot_membership
    from paramshard.observe.report.geo_plots import plots as geo_plots

    t0 = run.t0 or 0.0
    membership = [("membership.png", "Membership", "Live trainers and servers over time; moves of rows between "
                   "servers shaded.", lambda p: plot_membership(run, p))] if is_elastic(run.events) else []
    return [
        ("loss.png", "Loss and metrics", "Loss (and each logged metric) of every trainer over its steps.",
         lambda p: plots.plot_loss(run.trainers, p)),
        ("throughput.png", "Throughput",
         "Samples per second of each trainer and of all of them, over seconds since the first record.",
         lambda p: plots.plot_throughput(run.trainers, t0, p)),
        ("server_load.png", "Server load",
         "What each server held and served by its last record; a max/mean ratio well above 1 is a hot server.",
         lambda p: plots.plot_server_load(run.servers, p)),
        ("phases.png", "Step phases",
         "Mean time per step each trainer spent pulling, computing and pushing (weighted by steps).",
         lambda p: plots.plot_phases(run.trainers, p)),
        ("staleness.png", "Async staleness",
         "How many updates landed between a trainer's read and its push, summed over the servers.",
         lambda p: plots.plot_staleness(plots.staleness_histogram(run.servers, run.summary), p)),
        ("requests.png", "Server requests", "Requests per second each server handled over time.",
         lambda p: plots.plot_requests(run.servers, t0, p)),
    ] + membership + geo_plots(run)    # only a job whose trainers or servers changed has one; a GEO job its own


def write_report(run_dir: str | Path, out_dir: str | Path | None = None, run: RunData | None = None) -> Path:
    """Write the PNGs and index.html of a run directory (finished or not); return the index's path.
    ``run``: the directory already read (load_run), so that it is not read twice."""
    run = run if run is not None else load_run(run_dir)
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError as exc:
        raise ConfigError("paramshard report draws with matplotlib, which is not installed: "
                          "pip install 'matplotlib>=3.7'") from exc
    out = Path(out_dir) if out_dir is not None else run.run_dir / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the report folder {out}: {exc.strerror or exc}; "
                          "pass another with --out DIR") from exc
    entries = []
    try:
        for file, title, caption, draw in _plots(run):
            skipped = draw(out / file)
            if skipped:
                # A plot from an earlier report of this run would contradict the page.
                (out / file).unlink(missing_ok=True)
            entries.append(PlotEntry(file, title, caption, skipped))
        return write_index(run, entries, out)
    except OSError as exc:
        raise ConfigError(f"cannot write the report into {out}: {exc.strerror or exc}; "
                          "pass another folder with --out DIR") from exc
