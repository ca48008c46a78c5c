"""A stream run resumed from a checkpoint that already holds its --max-events (a job that failed at
its very end, e.g. a server killed while the trainer closed: benchmarks/online_exactly_once.py's
server@end) ends at once, successfully, with every event trained once. Before, its report of an
empty progressive window logged the undefined AUC as None into the run's records, and the trainer
died of `float(None)` (TypeError), so the job could not finish."""
import dataclasses

import pandas as pd

from paramshard.apps.ctr.options import parser, resolve
from paramshard.apps.ctr.stream import run as streaming
from paramshard.data.features.presets import criteo_schema
from paramshard.data.synthetic import generate_criteo
from tests.integration.test_ctr_app_stream import AppendedFrames
from tests.integration.tiny_ctr import in_process_env

EVENTS = 256


def test_a_resume_with_nothing_left_to_train_ends_normally(tmp_path, monkeypatch):
    schema = criteo_schema()
    schema.save(tmp_path / "schema.json")
    generate_criteo(tmp_path / "events.tsv", EVENTS, seed=5)
    events = pd.read_csv(tmp_path / "events.tsv", sep="\t", header=None, names=schema.format.names, dtype=str,
                         keep_default_na=False)
    ck, records = tmp_path / "ck", tmp_path / "records"

    def run(source, **fields):
        monkeypatch.setattr(streaming, "open_source", lambda spec, rank, world, **options: source)
        args = resolve(parser("ctr").parse_args(
            ["--stream", "test://appended", "--schema", str(tmp_path / "schema.json"), "--model", "lr",
             "--batch-size", "64", "--max-events", str(EVENTS)]))
        env, server = in_process_env()
        try:
            env = dataclasses.replace(env, checkpoint_dir=str(ck), records=f"dir:{records}", **fields)
            return streaming.stream_job(args, env, lambda text: None)
        finally:
            server.close()

    first = AppendedFrames()
    first.append(events)
    assert run(first)["events"] == EVENTS
    again = AppendedFrames()
    again.append(events)
    out = run(again, resume=str(ck))
    assert out["events"] == EVENTS and out["stopped_by"] == f"--max-events {EVENTS}"
    assert again.handed == []                 # nothing read twice
    assert out["progressive"]["window_events"] == 0
