"""The CTR app trained from a live stream (``--stream``): predict, then train, until stopped.

Every trainer opens the stream with its rank (each event goes to one trainer), polls batches
of up to --batch-size events, encodes them with the fitted schema (stream/options.py says why
it is not fitted here), scores each batch with the model as it stands (eval mode: no table row
is created, inference/evaluation.py) into the progressive window (progressive.py), then trains
on it. It stops at SIGTERM or Ctrl-C (after the batch in hand), at --max-events (this trainer's
events) or --max-seconds. The stream's position travels with the checkpoints through
data/stream/reader.py's StreamReader (saved with each, committed once written, sought on
``--resume`` and after a rollback); the count of events trained rides in the trainer's state
beside it, so --max-events and the run's figures go on from a resumed checkpoint.

Trainers of one job take steps at their own pace (events come when they come), which async mode
allows; in sync, collective and hybrid modes every step waits for every trainer's, so a job of
several trainers there is refused: one trainer or --mode async. (StreamReader could keep
such a job in step with empty steps while a trainer has no events, but a step without data
still moves the dense parameters under the servers' Adam: its moments decay into an update.)
"""
from __future__ import annotations

import math
import signal
import threading
import time

import numpy as np
import torch

import paramshard as ps
from paramshard.data.features.batch import TabularBatch
from paramshard.data.features.encode import Encoder
from paramshard.errors import ConfigError
from paramshard.mode import Mode
from paramshard.models.heads import head_of
from paramshard.apps.ctr.stream import progressive

POLL_SECONDS = 0.5       # the longest a poll waits: a stop (signal, --max-seconds) is seen this soon
EVENTS = "stream_events"    # trainer.state's count of events trained (saved with every checkpoint)


def open_source(spec: str, rank: int, world: int, **options):
    """The stream ``spec`` names, this trainer's share of it (data/stream/open.py)."""
    from paramshard.data.stream.open import open_stream
    return open_stream(spec, rank, world, **options)


def refuse(env) -> None:
    """The jobs a stream run cannot train in, with why (every trainer, at its start)."""
    if env.min_trainers is not None:
        raise ConfigError("--stream in an elastic job (launch --trainers MIN:MAX): a stream's events go to trainers "
                          "by rank, fixed at the start; launch a fixed number of trainers")
    if env.num_trainers > 1 and env.mode is not Mode.ASYNC:
        raise ConfigError(f"--stream with {env.num_trainers} trainers in {env.mode} mode: every step waits for "
                          f"every trainer's, but each trainer's events come at their own pace; launch with "
                          f"--mode async (or one trainer)")


def source_options(args) -> dict:
    """--delimiter for a directory's text files (a Kafka stream's records are JSON)."""
    if args.delimiter is None or args.stream.startswith("kafka://"):
        return {}
    from paramshard.data.readers.frames import parse_delimiter
    return {"delimiter": parse_delimiter(args.delimiter)}


class StopSignals:
    """SIGTERM and SIGINT end the run after the batch in hand (``stop``, e.g. StreamReader.stop;
    a second signal acts as before)."""

    def __init__(self, stop=lambda: None):
        self.received: str | None = None
        self._previous: dict = {}
        self._then = stop

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._stop)
        return self

    def _stop(self, signum, frame):
        self.received = signal.Signals(signum).name
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._then()

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class StreamRun:
    """One trainer's stream run: the loop, its stop conditions, its reports."""

    def __init__(self, args, env, trainer, model, schema, source, say):
        self.args, self.env, self.trainer, self.model, self.say = args, env, trainer, model, say
        from paramshard.data.stream.reader import StreamReader
        self.source = source
        # No empty batches: this app runs no job whose steps wait for every trainer (refuse()).
        self.reader = StreamReader(source, trainer, args.batch_size, poll_timeout=POLL_SECONDS, empty_batches=False)
        self.encoder = Encoder(schema)
        self.columns = schema.used_columns
        self.head = head_of(model)
        self.window = progressive.ProgressiveWindow(args.window)
        self.events = int(trainer.state.get(EVENTS, 0))      # trained before a resumed checkpoint
        self.resumed_at = self.events
        self._recoveries = trainer.recoveries
        self.skipped = 0
        self.reports: list[dict] = []
        self.stopped_by = None
        self.chief = env.trainer_id in (0, None)

    def encode(self, records) -> TabularBatch:
        missing = [c for c in self.columns if c not in records.columns]
        if missing:
            raise ConfigError(f"--stream {self.args.stream}: events without the schema's column(s) "
                              f"{', '.join(missing)} (they have {', '.join(map(str, records.columns))})")
        batch, bad = self.encoder.encode({c: records[c].to_numpy() for c in self.columns})
        if bad and not self.args.skip_bad_lines:
            row, reason = bad[0]
            raise ConfigError(f"--stream {self.args.stream}: a bad event ({reason}) in the batch before "
                              f"{self.source.position()} (--skip-bad-lines counts them instead)")
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

    def step(self, records) -> None:
        """Predict, then train, one step per batch the reader hands out (the positions it saves with
        checkpoints count on that): a batch whose events were all bad (--skip-bad-lines) steps
        without a loss, rare enough that its zero gradient's Adam update does not matter."""
        batch = self.encode(records)
        self.trainer.state[EVENTS] = self.events + len(records)     # the checkpoint this step writes holds it
        if len(batch):
            t = batch.torch()
            self.window.add(self.score(t), batch.labels)
            self.trainer.step(self.head.loss(self.model(t["dense"], t["ids"], t["offsets"], t["weights"]),
                                             t["labels"]))
        else:
            self.trainer.step()
        if self.trainer.recoveries != self._recoveries:      # rolled back: the checkpoint's count (reader: its position)
            self._recoveries = self.trainer.recoveries
            self.events = int(self.trainer.state.get(EVENTS, 0))
        else:
            self.events += len(records)

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

    def _wanted(self) -> None:
        """The reader's next batch: at most the events --max-events leaves."""
        if self.args.max_events is not None:
            self.reader.batch_size = max(1, min(self.args.batch_size, self.args.max_events - self.events))

    def report(self, started: float) -> dict:
        figures = self.window.result()
        seconds = time.monotonic() - started
        figures.update(seconds=round(seconds, 3), events_per_s=round((self.events - self.resumed_at) / seconds, 1)
                       if seconds > 0 else 0.0)
        self.reports.append({k: figures[k] for k in ("seconds", "events", "auc", "logloss", "window_events")})
        # An undefined figure (an empty window: a resume with nothing left to train; one class only)
        # is left out: the run's records take numbers (float(None) killed the trainer).
        defined = {k: v for k, v in (("progressive_auc", _number(figures["auc"])),
                                     ("progressive_logloss", _number(figures["logloss"]))) if v is not None}
        self.trainer.log(**defined, stream_events=self.events)
        self.say(f"{progressive.text(figures)}; {figures['events_per_s']:,.0f} events/s")
        return figures

    def run(self) -> dict:
        a = self.args
        started = last_report = time.monotonic()
        # --max-seconds while no event comes: the reader's loop looks at its stop after each poll.
        timer = threading.Timer(a.max_seconds, self.reader.stop) if a.max_seconds is not None else None
        with StopSignals(self.reader.stop) as signals:
            if timer is not None:
                timer.daemon = True
                timer.start()
            try:
                self.stopped_by = self.stop_reason(started, signals)
                self._wanted()
                for got in ([] if self.stopped_by else self.reader):
                    self.step(got.records)
                    if time.monotonic() - last_report >= a.report_every:
                        self.report(started)
                        last_report = time.monotonic()
                    self.stopped_by = self.stop_reason(started, signals)
                    if self.stopped_by:
                        break
                    self._wanted()
            finally:
                if timer is not None:
                    timer.cancel()
            self.stopped_by = self.stopped_by or self.stop_reason(started, signals) or "the stream ended"
        return self.report(started)


def _number(x: float):
    return None if math.isnan(x) else float(x)


def train(args, say) -> dict | None:
    """The stream run of every trainer; trainer 0 returns the run's --json document."""
    return stream_job(args, ps.init(), say)


def stream_job(args, env, say) -> dict | None:
    """train() in ``env`` (a test's: an in-process server, checkpoints, a resume)."""
    from paramshard.apps.ctr.stream.options import checked_schema
    from paramshard.apps.ctr.training import make_model
    refuse(env)
    schema = checked_schema(args)
    torch.manual_seed(args.seed)
    model = make_model(args, schema, env.mode.has_servers)
    trainer = ps.Trainer(model, optimizer=ps.optim.Adam(lr=args.lr), env=env)
    rank, world = env.trainer_id or 0, env.num_trainers or 1
    out = None
    try:
        source = open_source(args.stream, rank, world, **source_options(args))
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
                   "position": source.position(),        # after the last batch trained (nothing read ahead)
                   "settings": {"lr": args.lr, "table_lr": args.table_lr, "batch_size": args.batch_size,
                                "embedding_l2": args.embedding_l2, **args.architecture, "window": args.window},
                   "progressive": figures, "reports": run.reports}
            trainer.log(result=result_record(out))      # `paramshard report` says it first
        trainer.close()                 # the final checkpoint holds the last batch's position
    finally:
        if not trainer.closed:
            trainer.close(leave=False)
        source.close()                  # after the final checkpoint (StreamReader.close does the same)
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
