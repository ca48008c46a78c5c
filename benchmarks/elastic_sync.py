"""Servers 2 -> 3 -> 2 under a sync job with trainer.prefetching, through the CLI (issue 29's goal).

Launches ``paramshard launch --servers 2 --trainers 2 --mode sync --partitions P --run-dir RUN
benchmarks/elastic_sync_job.py ...``: the trainers fill a table of ``--rows`` rows (dim ``--dim``,
Adagrad), then train it with ``trainer.prefetching`` on batches of ``--batch`` of ``--hot`` hot ids
with integer gradients. Once they train, after ``--gap`` seconds (the baseline), this script runs
``paramshard scale RUN --servers 3``, waits for the run directory's scale_end event, ``--gap``
seconds, ``--servers 2``, and so on ``--repeats`` times; then it writes the step at which the
trainers stop, and trainer 0 checks every row against the batches made again from their seeds
(elastic_sync_job.py: a hot row whose Adagrad accumulator is not the sum of its steps' squared
averaged gradients is a lost, doubled or split update; also ids missing or held twice, untouched
rows whose accumulator moved).

From the run directory (observe/elastic_view.moves: the longest trainer step that overlapped each
move, from the trainers' step_end_t / step_max_s, a step never finished included) it prints per
move: seconds (the scale_end's, from the move's start on the servers; and from the `scale` command,
which includes starting a server), partitions, rows and MiB moved, dense blocks, the sync switch
step, the longest trainer step overlapping the move. Then per direction and over every move: the
max and the median; the baseline (the longest step between training and the first move) and the
check. Goal (issue 29): every move <= 10 s, the longest step overlapping any move <= 1 s, no lost
or doubled update. Exit 1 if the check fails (not for a missed goal: that is the measurement).

    PYTHONPATH=src .venv/bin/python benchmarks/elastic_sync.py [--rows 2000000] [--repeats 5]
        [--partitions 1024] [--hot 200000] [--batch 512] [--gap 3] [--markdown]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

JOB = str(Path(__file__).resolve().parent / "elastic_sync_job.py")
PARAMSHARD = str(Path(sys.executable).parent / "paramshard")
GOAL_MOVE_S, GOAL_STEP_S = 10.0, 1.0
MOVE_EVENTS = ("move", "scale_end")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000, help="table rows (the issue's figure: 10000000)")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--hot", type=int, default=200_000, help="ids the training batches are drawn from")
    p.add_argument("--batch", type=int, default=512, help="ids per trainer and step")
    p.add_argument("--repeats", type=int, default=5, help="2 -> 3 -> 2 this many times")
    p.add_argument("--partitions", type=int, default=1024)
    p.add_argument("--gap", type=float, default=3.0, help="seconds of training before, between and after moves")
    p.add_argument("--move-timeout", type=float, default=180.0, help="seconds a move may take before we give up")
    p.add_argument("--fill-timeout", type=float, default=900.0)
    p.add_argument("--run-dir", help="the job's run directory (default: a new temporary one, kept)")
    p.add_argument("--markdown", action="store_true")
    return p.parse_args(argv)


# -- reading the run directory (pure) ----------------------------------------------------------
def move_events(events: list[dict]) -> list[dict]:
    """The events elastic_view.moves makes a Move of, in the same order."""
    return [e for e in events if e.get("event") in MOVE_EVENTS and isinstance(e.get("t"), (int, float))
            and isinstance(e.get("seconds"), (int, float))]


def direction(event: dict) -> str:
    before, after = event.get("servers_before"), event.get("servers_after")
    return f"{len(before)}->{len(after)}" if isinstance(before, list) and isinstance(after, list) else "?"


def baseline_step(windows, begin: float, end: float) -> float | None:
    """The longest step of the stretches (elastic_view.step_windows) lying within [begin, end]."""
    inside = [length for _, a, b, length in windows if a >= begin and b <= end]
    return max(inside) if inside else None


def summarize(moves: list[dict]) -> list[tuple[str, float, float, float | None, float | None]]:
    """(direction, max seconds, median seconds, max longest step, median longest step) for each
    direction and for every move together ("all"); rows are each move's dict with ``move``,
    ``seconds``, ``longest_step`` (None: no step recorded over it)."""
    out = []
    kinds = sorted({m["move"] for m in moves})
    for kind in kinds + ["all"]:
        of = [m for m in moves if kind == "all" or m["move"] == kind]
        if not of:
            continue
        steps = [m["longest_step"] for m in of if m["longest_step"] is not None]
        out.append((kind, max(m["seconds"] for m in of), statistics.median(m["seconds"] for m in of),
                    max(steps) if steps else None, statistics.median(steps) if steps else None))
    return out


def stop_at(records: list[dict], now_margin_s: float, least: int = 200) -> int:
    """The step to stop at: past the furthest step the trainers' records name by ``now_margin_s``
    seconds of steps at their recent rate (at least ``least`` steps), so that every trainer reads
    it before getting there (a record lags its trainer by up to its interval)."""
    trainer = [r for r in records if r.get("kind") == "trainer" and isinstance(r.get("step"), int)]
    if not trainer:
        raise RuntimeError("no trainer record in the run directory: the trainers are not training")
    last = max(r["step"] for r in trainer)
    latest = max(r["t"] for r in trainer)
    recent = [r for r in trainer if r["t"] >= latest - 10.0]
    span = max(r["t"] for r in recent) - min(r["t"] for r in recent)
    rate = (max(r["step"] for r in recent) - min(r["step"] for r in recent)) / span if span > 0 else 0.0
    return last + max(least, math.ceil(rate * now_margin_s))


# -- the job -------------------------------------------------------------------------------------
class Job:
    def __init__(self, args, run_dir: Path, folder: Path):
        self.run_dir, self.stop, self.result = run_dir, folder / "stop", folder / "check.json"
        self.env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
        argv = [PARAMSHARD, "launch", "--servers", "2", "--trainers", "2", "--mode", "sync", "--partitions",
                str(args.partitions), "--run-dir", str(run_dir), JOB, "--rows", str(args.rows), "--dim",
                str(args.dim), "--hot", str(args.hot), "--batch", str(args.batch), "--stop", str(self.stop),
                "--result", str(self.result)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                                     env=self.env, start_new_session=True, preexec_fn=C._die_with_parent)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self.reader.start()

    def text(self, chars: int = 5000) -> str:
        return "".join(self.lines)[-chars:]

    def wait_for(self, needle: str, count: int, seconds: float) -> None:
        end = time.monotonic() + seconds
        while sum(needle in line for line in list(self.lines)) < count:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the job exited (code {self.proc.returncode}) before {needle!r}:\n{self.text()}")
            if time.monotonic() > end:
                raise TimeoutError(f"no {needle!r} x{count} within {seconds:g} s:\n{self.text()}")
            time.sleep(0.1)

    def records(self) -> list[dict]:
        path = self.run_dir / "metrics.jsonl"
        out = []
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                out.append(json.loads(line))
            except ValueError:       # the line being written
                pass
        return out

    def events(self, kind: str) -> list[dict]:
        return [r for r in self.records() if r.get("event") == kind]

    def scale(self, servers: int, seconds: float) -> dict:
        """`paramshard scale RUN --servers N`, then its scale_end event (with when we asked)."""
        ends = len(self.events("scale_end"))
        asked = time.time()
        done = subprocess.run([PARAMSHARD, "scale", str(self.run_dir), "--servers", str(servers)],
                              capture_output=True, text=True, timeout=90, cwd=ROOT, env=self.env)
        if done.returncode:
            raise RuntimeError(f"scale --servers {servers} failed:\n{done.stdout}{done.stderr}")
        end = time.monotonic() + seconds
        while len(self.events("scale_end")) <= ends:
            failed = [e for e in self.events("scale_failed") if e["t"] >= asked]
            if failed:
                raise RuntimeError(f"scale --servers {servers}: {failed[-1]}")
            if self.proc.poll() is not None:
                raise RuntimeError(f"the job exited (code {self.proc.returncode}) during the move:\n{self.text()}")
            if time.monotonic() > end:
                raise TimeoutError(f"no scale_end within {seconds:g} s of `scale --servers {servers}` (stuck move?);"
                                   f" the job's output:\n{self.text()}")
            time.sleep(0.1)
        return {"asked": asked, **self.events("scale_end")[ends]}

    def finish(self, seconds: float) -> dict:
        self.proc.wait(seconds)
        if self.proc.returncode:
            raise RuntimeError(f"the job exited with code {self.proc.returncode}:\n{self.text()}")
        return json.loads(self.result.read_text())

    def close(self) -> None:
        if self.proc.poll() is None:          # our launcher's process group (it started its ranks in it)
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(20)


def run(args) -> tuple[list[dict], dict, dict]:
    folder = Path(tempfile.mkdtemp(prefix="paramshard-elastic-sync-"))
    run_dir = Path(args.run_dir) if args.run_dir else folder / "run"
    log = lambda text: print(text, file=sys.stderr, flush=True)   # noqa: E731 - progress off the tables
    job = Job(args, run_dir, folder)
    try:
        job.wait_for("training from step", 2, args.fill_timeout)
        filled = [line.strip() for line in job.lines if "filled" in line]
        log("\n".join(filled))
        training = time.time()
        time.sleep(args.gap)
        asked, failure, check = {}, None, None
        try:
            for repeat in range(args.repeats):
                for servers in (3, 2):
                    end = job.scale(servers, args.move_timeout)
                    asked[end["t"]] = end["asked"]
                    log(f"repeat {repeat}: {direction(end)} servers {end['seconds']:.2f} s "
                        f"({end['t'] - end['asked']:.2f} s from the scale command), {end['partitions']} partitions,"
                        f" {end['rows']:,} rows, {end.get('blocks', 0)} blocks, switch step {end.get('switch_step')}")
                    time.sleep(args.gap)
        except (RuntimeError, TimeoutError) as exc:     # a move failed or stuck: report the moves before it
            failure = str(exc)
            log(f"FAILED: {failure}")
        if failure is None:
            stop = stop_at(job.records(), 5.0)
            tmp = job.stop.with_suffix(".tmp")
            tmp.write_text(str(stop))
            os.replace(tmp, job.stop)
            log(f"the trainers stop at step {stop}; trainer 0 checks every row")
            check = job.finish(args.move_timeout + args.fill_timeout)
        stopped = time.time()
    finally:
        job.close()
    log(f"run directory: {run_dir}")
    from paramshard.observe.run_records import elastic_view
    from paramshard.observe.run_records.run_data import load_run
    data = load_run(run_dir)
    ended = elastic_view.job_end(data.summary, data.events, data.trainers)
    found = elastic_view.moves(data.events, data.trainers, data.t0, ended)
    moves = []
    for event, move in zip(move_events(data.events), found):
        moves.append({"move": direction(event), "seconds": move.seconds,
                      "from_command": event["t"] - asked[event["t"]] if event["t"] in asked else None,
                      "partitions": move.partitions, "rows": move.rows, "bytes": move.bytes,
                      "blocks": event.get("blocks"), "switch_step": event.get("switch_step"),
                      "longest_step": move.longest_step})
    windows = elastic_view.step_windows(data.trainers, data.events, ended)
    first_move = min((e["t"] - e["seconds"] for e in move_events(data.events)), default=stopped)
    extra = {"baseline": baseline_step(windows, training, first_move), "run_dir": str(run_dir),
             "filled": filled, "failure": failure}
    return moves, check, extra


def check_problems(check: dict, rows: int) -> list[str]:
    """What the check found wrong (empty: every row as the batches say)."""
    wrong = [f"{check[k]} {k.replace('_', ' ')}" for k in ("hot_rows_wrong", "cold_rows_touched", "ids_held_twice",
                                                             "ids_missing", "ids_foreign") if check.get(k)]
    if check.get("rows_held") != rows:
        wrong.append(f"{check.get('rows_held')} rows held for {rows}")
    return wrong


def seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main(argv=None) -> int:
    args = parse_args(argv)
    C.install_sigterm_as_exit()
    note = C.machine_note()
    moves, check, extra = run(args)
    per_move = [[str(i + 1), m["move"], seconds(m["seconds"]), seconds(m["from_command"]), str(m["partitions"]),
                 f"{m['rows']:,}", f"{(m['bytes'] or 0) / C.MiB:.0f}", str(m["blocks"]), str(m["switch_step"]),
                 seconds(m["longest_step"])] for i, m in enumerate(moves)]
    summary = [[kind, seconds(top), seconds(med), seconds(step_top), seconds(step_med)]
               for kind, top, med, step_top, step_med in summarize(moves)]
    worst_move = max((m["seconds"] for m in moves), default=None)
    steps = [m["longest_step"] for m in moves if m["longest_step"] is not None]
    worst_step = max(steps) if steps else None
    problems = check_problems(check, args.rows) if check is not None else ["not checked"]
    verdict = lambda ok: "met" if ok else "NOT met"   # noqa: E731
    notes = [
        f"`elastic_sync.py --rows {args.rows} --dim {args.dim} --hot {args.hot} --batch {args.batch} "
        f"--repeats {args.repeats} --partitions {args.partitions} --gap {args.gap:g}`: launch --servers 2 "
        f"--trainers 2 --mode sync, trainer.prefetching, Adagrad; {note}",
        "; ".join(extra["filled"]),
        f"longest trainer step between training and the first move (baseline): {seconds(extra['baseline'])} s",
        f"check: {check['steps']:,} sync steps of {check['trainers']} trainers x {args.batch} ids; "
        f"{check['rows_held']:,} rows on servers {check['servers']}; lost, doubled or split updates (hot rows "
        f"whose accumulator differs): {check['hot_rows_wrong']} of {check['hot_rows']:,}; "
        f"untouched rows changed: {check['cold_rows_touched']}; ids missing {check['ids_missing']}, "
        f"held twice {check['ids_held_twice']}" if check is not None else
        f"FAILED after {len(moves)} moves (no check; the job's output is on stderr): "
        f"{extra['failure'].splitlines()[0][:800]}",
        f"goal: every move <= {GOAL_MOVE_S:g} s: {verdict(worst_move is not None and worst_move <= GOAL_MOVE_S)} "
        f"(max {seconds(worst_move)} s); longest step overlapping any move <= {GOAL_STEP_S:g} s: "
        f"{verdict(worst_step is not None and worst_step <= GOAL_STEP_S)} (max {seconds(worst_step)} s); " +
        (f"no lost or doubled update: {verdict(not problems)}" + (f" ({', '.join(problems)})" if problems else "")
         if check is not None else "lost or doubled updates: not checked"),
        f"run directory: {extra['run_dir']}",
    ]
    if check is not None and check.get("examples"):
        notes.insert(-2, "wrong hot rows (accumulator minus the oracle's, the steps that touched them; switch steps "
                         f"{[m['switch_step'] for m in moves]}): {json.dumps(check['examples'])}")
    C.emit(args.markdown, [
        ("Each move", ["#", "move", "seconds", "from `scale`", "partitions", "rows moved", "MiB", "dense blocks",
                       "switch step", "longest trainer step overlapping (s)"],
         per_move, [True, False, True, True, True, True, True, True, True, True]),
        ("Over the moves", ["move", "max s", "median s", "max longest step (s)", "median longest step (s)"],
         summary, [False, True, True, True, True])], notes)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
