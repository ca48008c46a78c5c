"""`paramshard report`'s index.html: the summary, the plan, the plots and links to the
logs, in one self-contained page (no JavaScript, nothing fetched from elsewhere), so it
opens from a copied run directory or a file:// URL alike. Every piece of text from the
run goes through html.escape: names and log paths are the user's."""
from __future__ import annotations

import html
import os
import time
from pathlib import Path
from typing import Collection, NamedTuple
from urllib.parse import quote

from paramshard.observe.run_records.run_data import RunData

MAX_EVENTS = 50   # a run that restarted a thousand times would bury the plots under its events


class PlotEntry(NamedTuple):
    file: str             # PNG name in the report folder
    title: str
    caption: str
    skipped: str | None   # why it was not drawn, or None


STYLE = """
body { font-family: sans-serif; margin: 2em; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1em 0 2em; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
.warn { background: #fff3cd; border: 1px solid #e0c36c; padding: 0.5em 1em; }
.skipped { color: #777; font-style: italic; }
"""


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _num(value) -> str:
    if isinstance(value, bool) or value is None:
        return "—" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.3f}"
    return str(value)


def _when(t) -> str:
    if not isinstance(t, (int, float)):
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _bytes(n) -> str:
    return f"{n / 2**20:,.1f} MiB" if isinstance(n, (int, float)) and not isinstance(n, bool) else _num(n)


def _list(value) -> list[dict]:
    """The dicts of a list from a JSON file; anything else (a hand-edited or truncated file) as empty."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _table(header: list[str], rows: list[list], numeric: Collection[int] = frozenset()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f'<td class="n">{_e(c)}</td>' if i in numeric else f"<td>{_e(c)}</td>"
                                    for i, c in enumerate(row)) + "</tr>\n" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody></table>\n"


def _pairs(rows: list[tuple[str, str]]) -> str:
    return "<table>\n" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>\n" for k, v in rows) + "</table>\n"


def _link(target: Path, out_dir: Path, text: str) -> str:
    # Relative, so the page keeps working when the run directory is copied or served.
    href = quote(Path(os.path.relpath(target, out_dir)).as_posix())
    return f'<a href="{_e(href)}">{_e(text)}</a>'


def _result(run: RunData) -> str:
    from paramshard.observe.report.run_result import result_lines
    lines = result_lines(run)
    kind = ' class="warn"' if lines[0].startswith("failed") else ""
    return f"<pre{kind}>" + _e("\n".join(lines)) + "</pre>\n"


def _summary(run: RunData) -> str:
    s = run.summary
    if s is None:
        rows = [("job id", run.job_id or "—"),
                ("status", "still running or interrupted (no summary.json yet)")]
        last = max((r["t"] for group in (*run.trainers.values(), *run.servers.values()) for r in group),
                   default=None)
        if run.t0 is not None:
            rows.append(("first record", _when(run.t0)))
        if last is not None:
            rows.append(("last record", f"{_when(last)} ({last - run.t0:,.1f} s after the first)"))
        for trainer, records in run.trainers.items():
            rows.append((f"trainer {trainer} last step", _num(records[-1].get("step"))))
        return ('<p class="warn">This run is still running or interrupted: it has no summary.json yet, '
                "so what follows is what its records show so far.</p>\n" + _pairs(rows))
    rows = [("job id", run.job_id or "—"), ("started", _when(s.get("started"))), ("ended", _when(s.get("ended"))),
            ("duration", f"{s['duration_s']:,.1f} s" if isinstance(s.get("duration_s"), (int, float)) else "—"),
            ("exit code", _num(s.get("exit_code")))]
    found = s.get("totals")
    totals: dict = found if isinstance(found, dict) else {}
    steps = totals.get("steps")
    if isinstance(steps, dict):
        rows.append(("steps", ", ".join(f"trainer {k}: {_num(v)}" for k, v in steps.items())))
    # The spec names sparse_rows and dense_elements; the server records' own names
    # (rows, elements) are read too.
    for keys, label in ((("samples",), "samples"), (("sparse_rows", "rows"), "sparse rows"),
                        (("dense_elements", "elements"), "dense elements"), (("requests",), "requests")):
        key = next((k for k in keys if k in totals), None)
        if key:
            rows.append((label, _num(totals[key])))
    for key, label in (("bytes_in", "bytes in"), ("bytes_out", "bytes out")):
        if key in totals:
            rows.append((label, _bytes(totals[key])))
    staleness = s.get("staleness")
    rows.append(("max staleness", _num(staleness.get("max")) if isinstance(staleness, dict) else "— (none: sync)"))
    out = _pairs(rows)
    processes = _list(s.get("processes"))
    if processes:
        out += "<h3>Processes</h3>\n" + _table(
            ["process", "host", "exit code"],
            [[p.get("name") or "?", p.get("host") or "—",
              "still running when the launcher stopped" if p.get("exit_code") is None else p["exit_code"]]
             for p in processes], numeric={2})
    return out


def _plan(run: RunData) -> str:
    plan = run.plan or {}
    servers = _list(plan.get("servers"))
    if not servers:
        return '<p class="skipped">No plan.json: the chief had not registered the model when the run stopped.</p>\n'
    rows = []
    for s in servers:
        found = s.get("tables")
        tables: dict = found if isinstance(found, dict) else {}
        rows.append([s.get("server", "?"), s.get("address", "—"), _num(s.get("dense_blocks")),
                     _num(s.get("dense_elements")),
                     ", ".join(f"{name} ({_num(t.get('rows'))} × {_num(t.get('dim'))})"
                               for name, t in tables.items() if isinstance(t, dict)) or "—"])
    out = _table(["server", "address", "dense blocks", "dense elements", "sparse tables"], rows, numeric={2, 3})
    ratio = plan.get("dense_load_max_over_mean")
    if isinstance(ratio, (int, float)):
        out += f"<p>dense load max/mean: {_e(f'{ratio:.3f}')}</p>\n"
    return out


def _events(run: RunData) -> str:
    events = run.events[-MAX_EVENTS:]
    if not events:
        return ""
    # "rank": which process a restart was for ("server 1", "job"); the other events are the job's
    rows = [[f"{e['t'] - run.t0:,.1f}", e.get("event", "?"), e.get("rank", "—"), e.get("text", "")]
            for e in events]
    shown = f" (last {MAX_EVENTS} of {len(run.events)})" if len(run.events) > MAX_EVENTS else ""
    return f"<h2>Events{_e(shown)}</h2>\n" + _table(["s since first record", "event", "rank", "text"], rows,
                                                      numeric={0})


def _elastic(run: RunData) -> str:
    """Membership changes, moves (with the longest trainer step during each) and recoveries
    of an elastic job; nothing for a job whose membership never changed."""
    from paramshard.observe.run_records import elastic_view as ev
    if not ev.is_elastic(run.events):
        return ""
    t0 = run.t0 or 0.0
    out = "<h2>Elastic job</h2>\n"
    changes = ev.membership_events(run.events)[-MAX_EVENTS:]
    if changes:
        out += "<h3>Membership</h3>\n" + _table(
            ["s since first record", "role", "rank", "change", "live after", "text"],
            [[f"{e['t'] - t0:,.1f}", e["role"], e.get("rank", "—"), e.get("change", "?"), _num(e.get("live")),
              e.get("text", "")] for e in changes], numeric={0, 4})
    ended = ev.job_end(run.summary, run.events, run.trainers)
    moved = ev.moves(run.events, run.trainers, t0, ended)
    if moved:
        out += "<h3>Moves</h3>\n"
        slow = [m for m in moved if m.slow]
        if slow:        # what a move is not meant to do: stop the trainers
            out += (f'<p class="warn">Trainer steps over {ev.SLOW_STEP_S:g} s during a move: ' + "; ".join(
                f"the move at {m.started:,.1f} s ({_e(m.servers)}): " + ", ".join(
                    f"trainer {t} {s:,.2f} s" for t, s in m.slow) for m in slow) + ".</p>\n")
        out += _table(
            ["started (s)", "servers", "seconds", "partitions", "rows", "bytes", "longest trainer step during it (s)"],
            [[f"{m.started:,.1f}", m.servers, f"{m.seconds:,.2f}", _num(m.partitions), _num(m.rows), _bytes(m.bytes),
              "—" if m.longest_step is None else f"{m.longest_step:,.2f}" + (" (over 1 s)" if m.slow else "")]
             for m in moved], numeric={0, 2, 3, 4, 6})
    recovered = ev.recoveries(run.events)
    if recovered:
        out += "<h3>Server recoveries</h3>\n" + _table(
            ["s since first record", "rank", "serving again after (s)", "updates lost", "text"],
            [[f"{e['t'] - t0:,.1f}", e.get("rank", "—"), _num(e.get("seconds")), _num(e.get("lost_updates")),
              e.get("text", "")] for e in recovered], numeric={0, 2, 3})
    stalls = ev.longest_steps(run.trainers, run.events, ended)
    if stalls:
        out += "<h3>Longest step of each trainer</h3>\n" + _table(
            ["trainer", "longest step (s)"], [[t, f"{s:,.3f}"] for t, s in stalls.items()], numeric={0, 1})
    return out


def _deltas(run: RunData) -> str:
    from paramshard.observe.report.deltas_view import html_section
    return html_section(run, _table, _e)


def _geo(run: RunData) -> str:
    from paramshard.observe.report.geo_section import html_section
    return html_section(run, _table, _e)


def _plots(entries: list[PlotEntry]) -> str:
    out = []
    for p in entries:
        if p.skipped:
            out.append(f'<h3>{_e(p.title)}</h3>\n<p class="skipped">Not drawn: {_e(p.skipped)}.</p>\n')
        else:
            out.append(f'<h3>{_e(p.title)}</h3>\n<figure><img src="{_e(quote(p.file))}" alt="{_e(p.title)}">'
                       f"<figcaption>{_e(p.caption)}</figcaption></figure>\n")
    return "".join(out)


def _files(run: RunData, out_dir: Path) -> str:
    items = [_link(log, out_dir, log.relative_to(run.run_dir).as_posix()) for log in run.logs]
    logs = ("<ul>\n" + "".join(f"<li>{i}</li>\n" for i in items) + "</ul>\n") if items else \
        '<p class="skipped">No logs/ folder in this run directory.</p>\n'
    others = [_link(run.run_dir / name, out_dir, name)
              for name in ("summary.json", "plan.json", "config.json", "metrics.jsonl")
              if (run.run_dir / name).is_file()]
    return "<h2>Logs</h2>\n" + logs + "<h2>Files</h2>\n<p>" + " · ".join(others) + "</p>\n"


def render_index(run: RunData, plots: list[PlotEntry], out_dir: Path) -> str:
    title = f"paramshard run {run.job_id or run.run_dir.name}"
    problems = "".join(f'<p class="warn">{_e(p)}</p>\n' for p in run.problems)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{_e(title)}</title>\n'
            f"<style>{STYLE}</style>\n</head>\n<body>\n<h1>{_e(title)}</h1>\n"
            f"<p>{_e(run.run_dir.resolve())}</p>\n{problems}"
            f"<h2>Result</h2>\n{_result(run)}<h2>Summary</h2>\n{_summary(run)}<h2>Plan</h2>\n{_plan(run)}{_events(run)}{_elastic(run)}{_deltas(run)}{_geo(run)}"
            f"<h2>Plots</h2>\n{_plots(plots)}{_files(run, out_dir)}</body>\n</html>\n")


def write_index(run: RunData, plots: list[PlotEntry], out_dir: Path) -> Path:
    path = Path(out_dir) / "index.html"
    tmp = path.with_name(".index.html.tmp")
    tmp.write_text(render_index(run, plots, Path(out_dir)), encoding="utf-8")
    os.replace(tmp, path)   # a browser reloading mid-write sees the old page or the new one
    return path
