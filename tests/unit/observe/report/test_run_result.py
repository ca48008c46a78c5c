"""`paramshard report`'s first lines: a run's result (the CTR app's best epoch with its
validation and test metrics) or its error (the launcher's failure summary), from run
directories built here as the launcher writes them (observe/run_records/records.py)."""
import argparse
import json

from paramshard.apps.ctr.result import result_record
from paramshard.cli.jobs import report as report_cli
from paramshard.observe.run_records.records import write_json
from paramshard.observe.run_records.run_data import load_run
from paramshard.observe.run_records.trainer_records import TrainerRecords
from paramshard.observe.report.html import render_index
from paramshard.observe.report.run_result import result_lines

T0 = 1_790_000_000.0
FAILURE = ("first failure: trainer 1 (exit code 3; pid 7 on this machine)\n    ValueError: boom\n"
           "  server 0: failed after trainer 1 (peer lost; exit code 75)")


def app_output():
    """What the CTR app's Run.finish returns (its --json document): epoch 2 of 3 was the best."""
    epochs = [{"epoch": e, "train_loss": 0.5 - e / 10, "valid": {"auc": v, "logloss": 0.4, "accuracy": 0.8,
                                                                  "rows": 366, "positive_rate": 0.2},
               "auc": 0.8, "logloss": 0.41, "accuracy": 0.81, "rows": 900}
              for e, v in ((1, 0.85), (2, 0.875), (3, 0.86))]
    final = {"auc": 0.8812, "logloss": 0.3456, "accuracy": 0.8432, "rows": 900}
    return {"model": "deepfm", "epochs": epochs, "best_epoch": 2, "best": final, "final": final, "warnings": []}


def run_dir(root, *, exit_code, records=(), events=()):
    """A run directory: trainer records (as TrainerRecords emits them), events, summary.json."""
    root.mkdir()
    lines = [{"t": T0, "kind": "event", "event": "start", "text": "1 servers, 2 trainers"}]
    lines += [dict(r, t=T0 + 1 + i) for i, r in enumerate(records)]
    lines += [{"t": T0 + 5, "kind": "event", **e} for e in events]
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    write_json(root / "summary.json", {"job_id": "ab12cd", "started": T0, "ended": T0 + 6, "duration_s": 6.0,
                                       "exit_code": exit_code, "processes": [], "totals": {}})
    return root


def trainer_records(result=None):
    """Trainer 0's records as it emits them, ``result`` logged at the end as the app does."""
    emitted = []
    records = TrainerRecords(0, emit=emitted.append, every=1e9)
    records.on_step(1, None, 0.0, 0.0)
    records.log(test_auc=0.8)
    records.flush()
    if result is not None:
        records.log(result=result)
    records.close()
    return json.loads(json.dumps(emitted))      # through JSON, as on the wire


def test_the_logged_result_rides_on_one_record_only():
    emitted = trainer_records({"best_epoch": 2})
    assert [r.get("result") for r in emitted] == [None, {"best_epoch": 2}]
    assert "result" not in emitted[-1]["metrics"] and emitted[-1]["logged"] == []      # not a value to plot


def test_a_ctr_app_run_says_its_best_epoch_and_its_validation_and_test_metrics_first(tmp_path, capsys, monkeypatch):
    run = run_dir(tmp_path / "run", exit_code=0, records=trainer_records(result_record(app_output())))
    assert result_lines(load_run(run)) == [
        "finished: exit code 0 after 6.0 s",
        "result: best epoch 2 of 3 (deepfm)",
        "  validation: AUC 0.8750 logloss 0.4000 accuracy 0.8000 (366 rows)",
        "  test:       AUC 0.8812 logloss 0.3456 accuracy 0.8432 (900 rows)"]
    # The command prints them before the page's path (matplotlib's drawing left out here).
    monkeypatch.setattr("paramshard.observe.report.report_files.write_report",
                        lambda run_dir, out, run=None: run_dir / "report/index.html")
    assert report_cli.run(argparse.Namespace(run_dir=run, out=None)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["finished: exit code 0 after 6.0 s", "result: best epoch 2 of 3 (deepfm)"]
    assert out[-1].endswith("index.html")


def test_a_failed_run_says_the_launchers_failure_summary_first(tmp_path):
    run = run_dir(tmp_path / "run", exit_code=3, records=trainer_records(),
                  events=[{"event": "failure", "text": FAILURE, "rank": "trainer 1", "exit_code": 3},
                          {"event": "end", "text": "exit code 3"}])
    assert result_lines(load_run(run)) == ["failed: exit code 3 after 6.0 s",
                                           *("  " + line for line in FAILURE.splitlines())]
    # The page says it at its top too, before the summary table.
    page = render_index(load_run(run), [], tmp_path)
    assert page.index('<h2>Result</h2>\n<pre class="warn">failed: exit code 3') < page.index("<h2>Summary</h2>")
    assert "  first failure: trainer 1 (exit code 3; pid 7 on this machine)" in page


def test_a_run_without_a_result_or_a_summary_says_so(tmp_path):
    run = run_dir(tmp_path / "a", exit_code=0, records=trainer_records())
    assert "the program logged no result" in result_lines(load_run(run))[0]
    run = run_dir(tmp_path / "b", exit_code=-9, records=trainer_records())
    assert result_lines(load_run(run))[:2] == ["failed: exit code -9 after 6.0 s",
                                               "  the launcher recorded no failure summary (stopped by a signal?): "
                                               "see logs/"]
    (run / "summary.json").unlink()
    assert result_lines(load_run(run)) == ["no summary.json: the run is still going, or its launcher was killed"]
