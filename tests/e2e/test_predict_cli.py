"""`paramshard export SOURCE` and `paramshard predict`, the real commands run in this process
(tests/e2e/in_process.py) on a tiny trained job (tests/integration/tiny_ctr.py). Oracles:
export of a run directory, a checkpoint directory and a step directory is the file
export-model writes of that checkpoint; --table from a checkpoint holds the rows the live
servers exported; predict's scores are the trained model's own forward."""
import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from paramshard.env import ClusterEnv
from paramshard.export import load_table
from paramshard.launch.api import LaunchConfig
from paramshard.observe.run_records.rank_records import write_rank
from paramshard.observe.run_records.run_dir import RunDir
from tests.e2e.in_process import cli_in_process
from tests.integration.test_serving_snapshot import same_file
from tests.integration.tiny_ctr import SCORE_BATCH, STEPS, Job


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return Job(tmp_path_factory.mktemp("predict_cli"))


def launched_run_dir(path, ckpt):
    """A run directory as `paramshard launch --checkpoint-dir CKPT` writes it."""
    run = RunDir(path, "job-1")
    run.write_config(LaunchConfig(module="paramshard.apps.ctr", checkpoint_dir=str(ckpt)), [])
    run.close()
    return path


def run_run_dir(path, ckpt):
    """A run directory of `paramshard run --run-dir`: only the ranks' own records."""
    env = ClusterEnv(role="trainer", servers=("127.0.0.1:1",), checkpoint_dir=str(ckpt))
    write_rank(path, "trainer 0", env)
    return path


@pytest.mark.parametrize("source", ["checkpoint", "step", "launch run", "run run"])
def test_export_of_a_run_or_checkpoint_is_export_model_of_its_checkpoint(job, tmp_path, capsys, source):
    assert cli_in_process(capsys, "export-model", job.ckpt, "--out", tmp_path / "want.pt")[0] == 0
    path = {"checkpoint": lambda: job.ckpt, "step": lambda: next(job.ckpt.glob("step-*")),
            "launch run": lambda: launched_run_dir(tmp_path / "run", job.ckpt),
            "run run": lambda: run_run_dir(tmp_path / "run", job.ckpt)}[source]()
    code, out, err = cli_in_process(capsys, "export", path, "--out", tmp_path / "m.pt")
    assert (code, err) == (0, "")
    assert f"wrote {tmp_path / 'm.pt'}: step {STEPS} of {next(job.ckpt.glob('step-*'))}" in out
    assert "model deepfm {'dim': 4, 'hidden': [8, 4], 'prefix': ''}" in out
    same_file(torch.load(tmp_path / "m.pt", weights_only=True), torch.load(tmp_path / "want.pt", weights_only=True))


def test_export_of_one_table_from_a_checkpoint_is_what_the_servers_held(job, tmp_path, capsys):
    code, out, _ = cli_in_process(capsys, "export", job.ckpt, "--table", "deep", "--out", tmp_path / "deep.npz")
    assert code == 0 and "of table 'deep' (dim 4)" in out
    table = load_table(tmp_path / "deep.npz")
    ids, values = job.table_rows["deep"]
    np.testing.assert_array_equal(table.ids, ids)
    np.testing.assert_array_equal(table.values, values)
    code, _, err = cli_in_process(capsys, "export", job.ckpt, "--table", "nope", "--out", tmp_path / "x.npz")
    assert code == 2 and "has no sparse table 'nope'; its tables: ['deep', 'wide']" in err


def test_export_names_what_it_expected(job, tmp_path, capsys):
    def error(*argv):
        code, _, err = cli_in_process(capsys, "export", *argv)
        assert code == 2 and err.startswith("paramshard export: error: ")
        return err

    assert "no such directory; expected a run directory" in error(tmp_path / "nope", "--out", tmp_path / "m.pt")
    (tmp_path / "empty").mkdir()
    assert "is none of a run directory (of `paramshard launch`" in error(tmp_path / "empty", "--out", "m.pt")
    no_ckpt = RunDir(tmp_path / "run", "job-2")
    no_ckpt.write_config(LaunchConfig(module="paramshard.apps.ctr"), [])
    no_ckpt.close()
    assert "recorded no checkpoint directory (it ran without --checkpoint-dir)" in error(tmp_path / "run", "--out",
                                                                                          tmp_path / "m.pt")
    assert "not both" in error(job.ckpt, "--servers", "127.0.0.1:1", "--out", tmp_path / "m.pt")
    assert "give --out FILE" in error(job.ckpt)
    assert not (tmp_path / "m.pt").exists()


def test_predict_writes_scores_and_says_how_good_they_are(job, tmp_path, capsys):
    cli_in_process(capsys, "export", job.ckpt, "--out", tmp_path / "m.pt")
    code, out, err = cli_in_process(capsys, "predict", tmp_path / "m.pt", job.root / "test.csv", "--out",
                                    tmp_path / "s.csv", "--batch-size", SCORE_BATCH)
    assert (code, err) == (0, "") and out.startswith(f"scored {len(job.test)} rows to {tmp_path / 's.csv'}: AUC 0.")
    np.testing.assert_array_equal(pd.read_csv(tmp_path / "s.csv")["score"], job.expected)
    # No --out: the scores are stdout (CSV), what is said of them stderr.
    code, out, err = cli_in_process(capsys, "predict", tmp_path / "m.pt", job.root / "new.parquet",
                                    "--batch-size", SCORE_BATCH)
    assert code == 0 and err == f"scored {len(job.test)} rows\n" and out.startswith("score\n")
    np.testing.assert_array_equal(np.array(out.split()[1:], np.float64), job.expected)
    code, _, err = cli_in_process(capsys, "predict", tmp_path / "m.pt", job.root / "new.csv", "--batch-size", 0)
    assert code == 2 and "--batch-size 0: must be >= 1" in err
    # --keep: a key column of the input before each score; empty input: an error, not 0 scores.
    code, out, err = cli_in_process(capsys, "predict", tmp_path / "m.pt", job.root / "new.csv", "--out",
                                    tmp_path / "k.csv", "--batch-size", SCORE_BATCH, "--keep", "city")
    kept = pd.read_csv(tmp_path / "k.csv")
    assert code == 0 and list(kept.columns) == ["city", "score"], (out, err)
    assert kept["city"].tolist() == pd.read_csv(job.root / "new.csv")["city"].tolist()
    np.testing.assert_array_equal(kept["score"], job.expected)
    (tmp_path / "empty.csv").write_text("price,city,tags\n")
    code, out, err = cli_in_process(capsys, "predict", tmp_path / "m.pt", tmp_path / "empty.csv")
    assert (code, out) == (2, "") and "no rows to score in" in err and "scored" not in err


def test_a_refusal_reaches_the_user_from_the_real_command(tmp_path):
    """One child process (the rest run in this one): exit code 2 and one line naming the file."""
    import subprocess
    import sys
    (tmp_path / "d.csv").write_text("price,city,tags\n1,paris,a\n")
    done = subprocess.run([sys.executable, "-m", "paramshard", "predict", tmp_path / "nope.pt", tmp_path / "d.csv"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"paramshard predict: error: {tmp_path / 'nope.pt'}: no such file; make one with "
                           f"`paramshard export-model CHECKPOINT --out FILE`\n")
