"""GEO round records (geo/records.py) reach the run directory both ways records travel, and
load_run gives back every one, once: through the launcher (stdout behind MARK, as under
`paramshard launch`) and into metrics/ (`paramshard run --run-dir`)."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from types import SimpleNamespace

from paramshard.geo.records import RoundRecords, round_record
from paramshard.geo.schedule import Round
from paramshard.observe.run_records.records import MARK
from paramshard.observe.run_records.run_data import load_run
from paramshard.observe.run_records.run_dir import RunDir

T0 = 1_790_000_000.0


def a_round(k: int) -> Round:
    return Round(steps=k, compute_seconds=0.01 * k, wire_seconds=0.05, bytes_sent=1000 * k, delta_norm=1.5,
                 value_norm=10.0, drift_norm=0.25)


def test_under_the_launcher_every_round_reaches_metrics_jsonl_once(tmp_path):
    records = RoundRecords(None, trainer_id=1)
    out = io.StringIO()
    with redirect_stdout(out):
        for i, k in enumerate((4, 8, 16)):
            records.add(a_round(k), next_k=2 * k, step=(4, 12, 28)[i], t=T0 + i)
    lines = out.getvalue().split("\n")[:-1]      # not splitlines: MARK starts with \x1e, a line break to it
    assert len(lines) == 3 and all(line.startswith(MARK) for line in lines)

    run_dir = RunDir(tmp_path / "run", "job-geo")

    class Rank:
        name = "trainer 1"

    tap = run_dir.tap_for(Rank())
    assert all(tap(line + "\n") for line in lines)         # taken out of the output, not logged
    run_dir.close()
    assert (tmp_path / "run/logs/trainer-1.log").read_text() == ""
    run = load_run(tmp_path / "run")
    rounds = run.geo_rounds[1]
    assert [(r["k"], r["next_k"], r["step"], r["staleness"], r["bytes"], r["t"]) for r in rounds] == [
        (4, 8, 4, 4, 4000, T0), (8, 16, 12, 8, 8000, T0 + 1), (16, 32, 28, 16, 16000, T0 + 2)]
    assert rounds[0]["wire_s"] == 0.05 and rounds[0]["compute_s"] == 0.04 and rounds[0]["drift_norm"] == 0.25
    assert run.trainers == {}          # not taken for progress records


def test_with_a_run_dir_the_trainer_writes_its_own_file(tmp_path):
    records = RoundRecords.for_env(SimpleNamespace(records=f"dir:{tmp_path / 'run'}", trainer_id=0))
    records.add(a_round(2), next_k=3, step=2, t=T0)
    records.add(a_round(3), next_k=3, step=5, t=T0 + 1)
    records.close()
    lines = (tmp_path / "run/metrics/geo-trainer-0.jsonl").read_text().splitlines()
    assert [json.loads(line)["kind"] for line in lines] == ["geo_round", "geo_round"]
    assert [r["k"] for r in load_run(tmp_path / "run").geo_rounds[0]] == [2, 3]


def test_no_records_asked_for_none_made():
    assert RoundRecords.for_env(SimpleNamespace(records=None, trainer_id=0)) is None
    assert RoundRecords.for_env(SimpleNamespace(records="stdout", trainer_id=0)).emit is not None


def test_a_round_records_the_settled_drift_beside_the_whole():
    done = Round(steps=4, compute_seconds=0.04, wire_seconds=0.05, bytes_sent=4000, delta_norm=1.5, value_norm=10.0,
                 drift_norm=4.0, settled_value_norm=8.0, settled_drift_norm=0.4)
    record = round_record(0, done, next_k=8, step=4, t=T0)
    assert (record["drift_norm"], record["value_norm"]) == (4.0, 10.0)
    assert (record["settled_drift_norm"], record["settled_value_norm"]) == (0.4, 8.0)
    assert round_record(0, a_round(4), 8, 4, T0)["settled_drift_norm"] is None     # not measured: None
