"""The CTR app trained from a live stream (issue 33), in one process (its standalone server).

- A writer appends the demo's synthetic Criteo events (`paramshard gen-data`'s generator: a hidden
  logistic model) as CSV lines to a file of a directory while `python -m paramshard.apps.ctr
  --stream DIR --max-events N` trains on them: it trains N events and its stream position is
  after the file's last byte and record (each event once); predict then train: the progressive
  AUC over the last WINDOW events is close to the AUC the final (exported) model scores on fresh
  events of the same hidden model, below the hidden model's own (no model beats the truth) and
  below the final model's on the events it trained on (it remembers those). The bound is loose
  (0.03: the window's events were scored by the models of the last third of the pass, and a
  window of 2,000 events has an AUC standard error near 0.012); the issue's 0.005 goal on the
  demo's full data is a benchmark's.
- Stopped and resumed from its checkpoint, a stream run hands out every event once and ends with
  the model of one uninterrupted run (a source that records what it handed out: the audit).
"""
import json
import threading
import time

import numpy as np
import pandas as pd
from sklearn.metrics import roc_auc_score

from paramshard.apps import ctr
from paramshard.apps.ctr.stream import run as streaming
from paramshard.data.features.presets import criteo_schema
from paramshard.data.synthetic import generate_criteo
from paramshard.data.readers.tabular import TabularReader
from paramshard.inference.evaluation import predict
from paramshard.inference.serving import load_model

EVENTS, HELD, CHUNK, WINDOW = 6000, 3000, 640, 2000     # the writer appends CHUNK events at a time


class AppendedFrames:
    """A StreamSource (data/stream/source.py) over frames a writer appends while it is read:
    the position is the next row; every row handed out is recorded (the test's audit)."""

    def __init__(self):
        self.frames: list[pd.DataFrame] = []
        self.rows = 0
        self.next = 0
        self.handed: list[int] = []
        self.cond = threading.Condition()
        self.closed = False

    def append(self, frame: pd.DataFrame) -> None:
        with self.cond:
            self.frames.append(frame)
            self.rows += len(frame)
            self.cond.notify_all()

    def poll(self, max_records, timeout):
        with self.cond:
            if not self.cond.wait_for(lambda: self.rows > self.next, timeout):
                return None
            whole = pd.concat(self.frames, ignore_index=True)
            out = whole.iloc[self.next:self.next + max_records]
            self.handed += range(self.next, self.next + len(out))
            self.next += len(out)
            return streaming_batch(out.reset_index(drop=True), {"row": self.next})

    def position(self):
        return {"row": self.next}

    def seek(self, position):
        self.next = position["row"]

    def commit(self, position):
        pass

    def close(self):
        self.closed = True


def streaming_batch(records, position):
    from paramshard.data.stream.source import StreamBatch
    return StreamBatch(records, position, time.time())


def test_a_stream_run_trains_every_event_once_and_its_progressive_auc_is_honest(tmp_path):
    schema = criteo_schema()
    schema.save(tmp_path / "schema.json")
    truth = generate_criteo(tmp_path / "all.tsv", EVENTS + HELD, seed=3)
    lines = (tmp_path / "all.tsv").read_text().splitlines(keepends=True)
    (tmp_path / "events.tsv").write_text("".join(lines[:EVENTS]))
    (tmp_path / "fresh.tsv").write_text("".join(lines[EVENTS:]))     # the same hidden model's, never streamed
    live = tmp_path / "live"
    live.mkdir()
    names = schema.format.names

    def writer():
        """Appends the events as CSV lines, CHUNK at a time, while the app reads the file."""
        with open(live / "events.csv", "w") as f:
            f.write(",".join(names) + "\n")
            for start in range(0, EVENTS, CHUNK):
                f.write("".join(line.replace("\t", ",") for line in lines[start:min(start + CHUNK, EVENTS)]))
                f.flush()
                time.sleep(0.05)
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    out_file, model_file = tmp_path / "out.json", tmp_path / "model.pt"
    assert ctr.main(["--stream", str(live), "--schema", str(tmp_path / "schema.json"), "--model", "lr",
                     "--batch-size", "128", "--max-events", str(EVENTS), "--window", str(WINDOW),
                     "--report-every", "0.5", "--json", str(out_file), "--export", str(model_file)]) == 0
    thread.join(timeout=30)
    out = json.loads(out_file.read_text())
    # Every event once: the run trained EVENTS, and the stream stands after the file's last byte and record.
    assert out["events"] == EVENTS and out["stopped_by"] == f"--max-events {EVENTS}" and out["skipped"] == 0
    assert out["position"]["files"] == {"events.csv": {"bytes": (live / "events.csv").stat().st_size,
                                                       "records": EVENTS}}
    assert out["progressive"]["window_events"] == WINDOW and out["progressive"]["events"] == EVENTS
    assert len(out["reports"]) >= 1
    progressive = out["progressive"]["auc"]
    model = load_model(model_file)
    same = offline_auc(model, tmp_path / "events.tsv", schema)
    fresh = offline_auc(model, tmp_path / "fresh.tsv", schema)
    print(f"progressive AUC {progressive:.4f}; the final model offline: {same:.4f} on the streamed events, "
          f"{fresh:.4f} on fresh ones; the hidden model {truth.hidden_auc:.4f}")
    assert abs(progressive - fresh) < 0.03
    # Scored before training, unlike the final model on the events it trained on (it remembers them).
    assert progressive < same
    assert progressive < truth.hidden_auc


def offline_auc(model, path, schema) -> float:
    reader = TabularReader([path], schema, 4096)
    labels = np.concatenate([b.labels for b in TabularReader([path], schema, 4096)])
    return roc_auc_score(labels, predict(model, reader))


def test_a_stopped_and_resumed_stream_run_trains_every_event_once_as_one_run_would(tmp_path, monkeypatch):
    """Stopped after 24 batches (its final checkpoint holds the stream's position), resumed from that
    checkpoint: the source is sought there, hands out the rest once each, and the model equals an
    uninterrupted run's on the same events (its predictions, bit for bit)."""
    import dataclasses
    from paramshard.apps.ctr.options import parser, resolve
    from tests.integration.tiny_ctr import in_process_env

    schema = criteo_schema()
    schema.save(tmp_path / "schema.json")
    events_n, first = 2048, 1024             # 16 + 8 batches of 128
    generate_criteo(tmp_path / "all.tsv", events_n + 500, seed=4)
    lines = (tmp_path / "all.tsv").read_text().splitlines(keepends=True)
    (tmp_path / "fresh.tsv").write_text("".join(lines[events_n:]))
    (tmp_path / "events.tsv").write_text("".join(lines[:events_n]))
    events = pd.read_csv(tmp_path / "events.tsv", sep="\t", header=None, names=schema.format.names, dtype=str,
                         keep_default_na=False)

    def run(max_events, model_file, source, **env_fields):
        monkeypatch.setattr(streaming, "open_source", lambda spec, rank, world, **options: source)
        args = resolve(parser("ctr").parse_args(
            ["--stream", "test://appended", "--schema", str(tmp_path / "schema.json"), "--model", "lr",
             "--batch-size", "128", "--max-events", str(max_events), "--export", str(model_file)]))
        env, server = in_process_env()
        try:
            return streaming.stream_job(args, dataclasses.replace(env, **env_fields), lambda text: None)
        finally:
            server.close()

    def appended():
        source = AppendedFrames()
        source.append(events)
        return source

    whole = appended()
    out = run(events_n, tmp_path / "whole.pt", whole)
    assert out["events"] == events_n and whole.handed == list(range(events_n))
    ck = tmp_path / "ck"
    before, after = appended(), appended()
    out = run(first, tmp_path / "before.pt", before, checkpoint_dir=str(ck), checkpoint_every=5)
    assert out["events"] == first and before.handed == list(range(first))
    out = run(events_n, tmp_path / "after.pt", after, checkpoint_dir=str(ck), resume=str(ck))
    assert after.handed == list(range(first, events_n))         # sought to the checkpoint's position
    assert out["events"] == events_n                              # the budget goes on from the checkpoint's count
    scores = [predict(load_model(tmp_path / name), TabularReader([tmp_path / "fresh.tsv"], schema, 4096))
              for name in ("whole.pt", "after.pt")]
    np.testing.assert_array_equal(scores[0], scores[1])
