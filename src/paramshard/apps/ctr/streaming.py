"""The CTR app trained from a live stream (``--stream``): predict, then train, until stopped.

Every trainer opens the stream with its rank (each event goes to one trainer), polls batches
of up to --batch-size events, encodes them with the fitted schema (stream_options.py says why
it is not fitted here), scores each batch with the model as it stands (eval mode: no table row
is created, inference/evaluation.py) into the progressive window (progressive.py), then trains
on it. It stops at SIGTERM or Ctrl-C (after the batch in hand), at --max-events (this trainer's
events) or --max-seconds; close() writes the final checkpoint with the stream's position
(stream_position.py), so `launch --resume` goes on from the next event.

Trainers of one job take steps at their own pace (events come when they come), which async mode
allows; in sync, collective and hybrid modes every step waits for every trainer's, so a job of
several trainers there is refused: one trainer or --mode async.
"""
from __future__ import annotations

import math
import signal
import threading
import time

import numpy as np
import torch

import paramshard as ps
from paramshard.data.features.encode import Encoder
from paramshard.errors import ConfigError
from paramshard.mode import Mode
from paramshard.models.heads import head_of
from paramshard.apps.ctr import progressive
from paramshard.apps.ctr.stream_position import StreamPosition

POLL_SECONDS = 0.5       # the longest a poll waits: stop signals and reports are looked at this often


def open_source(spec: str, rank: int, world: int):
    """The stream ``spec`` names, this trainer's share of it (data/stream/open.py)."""
    try:
        from paramshard.data.stream.open import open_stream
    except ImportError:
        raise ConfigError(f"--stream {spec}: this paramshard has no stream sources (paramshard.data.stream.open "
                          f"is missing)") from None
    return open_stream(spec, rank, world)


def refuse(env) -> None:
    """The jobs a stream run cannot train in, with why (every trainer, at its start)."""
    if env.min_trainers is not None:
        raise ConfigError("--stream in an elastic job (launch --trainers MIN:MAX): a stream's events go to trainers "
                          "by rank, fixed at the start; launch a fixed number of trainers")
    if env.num_trainers > 1 and env.mode is not Mode.ASYNC:
        raise ConfigError(f"--stream with {env.num_trainers} trainers in {env.mode} mode: every step waits for "
                          f"every trainer's, but each trainer's events come at their own pace; launch with "
                          f"--mode async (or one trainer)")


class StopSignals:
    """SIGTERM and SIGINT end the run after the batch in hand (a second one acts as before)."""

    def __init__(self):
        self.received: str | None = None
        self._previous: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._stop)
        return self

    def _stop(self, signum, frame):
        self.received = signal.Signals(signum).name
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class StreamRun:
    """One trainer's stream run: the loop, its stop conditions, its reports."""

    def __init__(self, args, env, trainer, model, schema, source, say):
        self.args, self.env, self.trainer, self.model, self.say = args, env, trainer, model, say
        self.source = source
        self.encoder = Encoder(schema)
        self.columns = schema.used_columns
        self.head = head_of(model)
        self.window = progressive.ProgressiveWindow(args.window)
        self.positions = StreamPosition(trainer, source)
        self.events = self.positions.resume()     # trained before a resumed checkpoint
        self.resumed_at = self.events
        self.skipped = 0
        self.reports: list[dict] = []
        self.stopped_by = None
        self.chief = env.trainer_id in (0, None)

    def encode(self, records) -> object:
        missing = [c for c in self.columns if c not in records.columns]
        if missing:
            raise ConfigError(f"--stream {self.args.stream}: events without the schema's column(s) "
                              f"{', '.join(missing)} (they have {', '.join(map(str, records.columns))})")
        batch, bad = self.encoder.encode({c: records[c].to_numpy() for c in self.columns})
        if bad and not self.args.skip_bad_lines:
            row, reason = bad[0]
            raise ConfigError(f"--stream {self.args.stream}: a bad event ({reason}) at {self.source.position()} "
                              f"(--skip-bad-lines counts them instead)")
        self.skipped += len(bad)
        return batch

    def score(self, t: dict) -> np.ndarray:
        """The batch scored by the model as it stands, creating no row (evaluation's eval mode)."""
        self.model.eval()
        try:
            with torch.no_grad():
                return self.head.scores(self.model(t["dense"], t["ids"], t["offsets"], t["weights"])).double().numpy()
        finally:
            self.model.train()

    def step(self, batch, records: int, position: dict) -> None:
        """Predict, then train: ``records`` events (``batch`` their good rows) end at ``position``."""
        t = batch.torch()
        self.window.add(self.score(t), batch.labels)
        loss = self.head.loss(self.model(t["dense"], t["ids"], t["offsets"], t["weights"]), t["labels"])
        self.positions.trained(position, self.events + records)
        self.trainer.step(loss)
        rolled_back = self.positions.after_step()
        self.events = self.events + records if rolled_back is None else rolled_back

    def stop_reason(self, started: float, signals: StopSignals) -> str | None:
        a = self.args
        if signals.received:
            return signals.received
        if self.trainer.leave_requested:
            return "asked to leave"
        if a.max_events is not None and self.events >= a.max_events:
            return f"--max-events {a.max_events}"
        if a.max_seconds is not None and time.monotonic() - started >= a.max_seconds:
            return f"--max-seconds {a.max_seconds:g}"
        return None

    def report(self, started: float) -> dict:
        figures = self.window.result()
        seconds = time.monotonic() - started
        figures.update(seconds=round(seconds, 3), events_per_s=round((self.events - self.resumed_at) / seconds, 1)
                       if seconds > 0 else 0.0)
        self.reports.append({k: figures[k] for k in ("seconds", "events", "auc", "logloss", "window_events")})
        self.trainer.log(progressive_auc=_number(figures["auc"]), progressive_logloss=_number(figures["logloss"]),
                         stream_events=self.events)
        self.say(f"{progressive.text(figures)}; {figures['events_per_s']:,.0f} events/s")
        return figures

    def run(self) -> dict:
        a = self.args
        started = last_report = time.monotonic()
        with StopSignals() as signals:
            while True:
                self.stopped_by = self.stop_reason(started, signals)
                if self.stopped_by:
                    break
                want = a.batch_size if a.max_events is None else min(a.batch_size, a.max_events - self.events)
                got = self.source.poll(want, POLL_SECONDS)
                if got is not None and len(got.records):
                    batch = self.encode(got.records)
                    if len(batch):
                        self.step(batch, len(got.records), got.position)
                    else:           # every event of it was bad: nothing to step, the position moves on
                        self.events += len(got.records)
                        self.positions.trained(got.position, self.events)
                if time.monotonic() - last_report >= a.report_every:
                    self.report(started)
                    last_report = time.monotonic()
        return self.report(started)


def _number(x: float):
    return None if math.isnan(x) else float(x)


def train(args, say) -> dict | None:
    """The stream run of every trainer; trainer 0 returns the run's --json document."""
    return stream_job(args, ps.init(), say)


def stream_job(args, env, say) -> dict | None:
    """train() in ``env`` (a test's: an in-process server, checkpoints, a resume)."""
    from paramshard.apps.ctr.stream_options import checked_schema
    from paramshard.apps.ctr.training import make_model
    refuse(env)
    schema = checked_schema(args)
    torch.manual_seed(args.seed)
    model = make_model(args, schema, env.mode.has_servers)
    trainer = ps.Trainer(model, optimizer=ps.optim.Adam(lr=args.lr), env=env)
    rank, world = env.trainer_id or 0, env.num_trainers or 1
    out = None
    try:
        source = open_source(args.stream, rank, world)
    except BaseException:
        trainer.close(leave=False)
        raise
    try:
        run = StreamRun(args, env, trainer, model, schema, source, say)
        say(_describe(args, env, schema))
        if run.resumed_at:
            say(f"resumed from the checkpoint: {run.resumed_at:,} events trained before it, the stream at its position")
        figures = run.run()
        say(f"stopped ({run.stopped_by}) after {run.events:,} events on trainer {rank}"
            + (f", {run.skipped:,} bad ones skipped" if run.skipped else ""))
        if run.chief:
            if args.export:
                trainer.pull()          # async: the other trainers' pushes too
                _export(args, trainer, say)
            out = {"model": args.model, "stream": args.stream, "trainers": world, "servers": len(env.servers),
                   "mode": str(env.mode), "stopped_by": run.stopped_by, "events": run.events, "skipped": run.skipped,
                   "settings": {"lr": args.lr, "table_lr": args.table_lr, "batch_size": args.batch_size,
                                "embedding_l2": args.embedding_l2, **args.architecture, "window": args.window},
                   "progressive": figures, "reports": run.reports}
            trainer.log(result=result_record(out))      # `paramshard report` says it first
        trainer.close()                 # the final checkpoint holds the last batch's position
        run.positions.commit()
    finally:
        source.close()
        if not trainer.closed:
            trainer.close(leave=False)
    return out


def result_record(out: dict) -> dict:
    """The run directory's result (apps/ctr/result.py's, for a stream run): flat figures."""
    p = out["progressive"]
    return {"app": "paramshard.apps.ctr", "model": out["model"], "stream": out["stream"], "events": out["events"],
            "progressive_auc": _number(p["auc"]), "progressive_logloss": _number(p["logloss"]),
            "window_events": p["window_events"], "stopped_by": out["stopped_by"]}


def _export(args, trainer, say) -> None:
    """The model as trained when the run stopped (inference/serving.py's format)."""
    from pathlib import Path
    from paramshard.inference.serving import snapshot_model
    Path(args.export).parent.mkdir(parents=True, exist_ok=True)
    snapshot_model(trainer, args.export)
    say(f"wrote {args.export}: the model as the stream run left it (`paramshard predict {args.export} DATA`)")


def _describe(args, env, schema) -> str:
    from paramshard.apps.ctr.options import describe
    stop = ", ".join(filter(None, [f"--max-events {args.max_events:,}" if args.max_events else "",
                                   f"--max-seconds {args.max_seconds:g}" if args.max_seconds else "",
                                   "SIGTERM or Ctrl-C"]))
    return (f"{describe(args)}\n{schema.num_dense} dense features and {schema.num_fields} id fields; "
            f"{env.num_trainers or 1} trainer(s), {len(env.servers)} server(s), {env.mode} mode; training from "
            f"the stream {args.stream} until {stop}; each batch scored before it trains (progressive AUC over the "
            f"last {args.window:,} events, every {args.report_every:g} s)")
