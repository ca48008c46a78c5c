"""`paramshard launch` checks the program's arguments before it starts anything
(launch/rank/app_check.py): the CTR app's bad flags are refused once, exit code 2, with
argparse's message, no run directory made and no launcher built; a forgotten -m is named."""
import textwrap

import pytest

from paramshard.cli.jobs import launch as launch_cli
from paramshard.cli.main import main

CTR = ["-m", "paramshard.apps.ctr"]


@pytest.fixture
def nothing_starts(monkeypatch, tmp_path):
    """Building a launcher (the first thing that starts processes) fails the test; the cwd is empty."""
    def refuse(*a, **k):
        raise AssertionError("the launcher was built: processes would start")
    monkeypatch.setattr(launch_cli, "build_launcher", refuse)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "run"


def launch(run_dir, *words):
    return main(["launch", "--servers", "2", "--trainers", "2", "--run-dir", str(run_dir), *words])


def data(tmp_path):
    (tmp_path / "t.csv").write_text("y,a\n1,x\n0,z\n")
    (tmp_path / "s.json").write_text('{"label": "y", "columns": [{"name": "a", "kind": "categorical"}]}')
    return ["--train", str(tmp_path / "t.csv"), "--test", str(tmp_path / "t.csv"), "--schema", str(tmp_path / "s.json")]


def test_a_bad_ctr_model_is_refused_before_anything_starts(nothing_starts, tmp_path, capsys):
    code = launch(nothing_starts, *CTR, *data(tmp_path), "--model", "xgboost")
    err = capsys.readouterr().err
    assert code == 2
    assert "-m paramshard.apps.ctr: argument --model: invalid choice: 'xgboost'" in err
    assert len(err.strip().splitlines()) == 1, err          # once, one line
    assert not nothing_starts.exists()                      # no run directory, so no logs of any rank


def test_a_missing_schema_flag_or_file_is_refused_before_anything_starts(nothing_starts, tmp_path, capsys):
    assert launch(nothing_starts, *CTR, "--train", "t.csv", "--test", "t.csv") == 2
    assert "the following arguments are required: --schema" in capsys.readouterr().err
    args = data(tmp_path)
    args[-1] = str(tmp_path / "nope.json")
    assert launch(nothing_starts, *CTR, *args) == 2
    assert "nope.json: cannot read the schema" in capsys.readouterr().err
    args = data(tmp_path)
    args[1] = str(tmp_path / "train.csv")
    assert launch(nothing_starts, *CTR, *args) == 2
    err = capsys.readouterr().err
    assert "-m paramshard.apps.ctr: --train " in err and "train.csv: no such file (did you mean 't.csv'?)" in err, err
    assert not nothing_starts.exists()


def test_a_script_with_its_own_check_is_checked_and_one_without_is_not_imported(nothing_starts, tmp_path, capsys):
    checked = tmp_path / "checked.py"
    checked.write_text(textwrap.dedent("""
        from paramshard.errors import ConfigError
        def check_arguments(argv, files=True):
            if "--bad" in argv:
                raise ConfigError(f"--bad is bad (files={files}, argv={argv})")
        if __name__ == "__main__":
            raise SystemExit("ran")
    """))
    assert launch(nothing_starts, str(checked), "--x", "--bad") == 2
    assert "checked.py: --bad is bad (files=True, argv=['--x', '--bad'])" in capsys.readouterr().err
    # A script that does its work at import is never imported by the launcher: the check
    # is opt-in, read from the file's text first.
    plain = tmp_path / "plain.py"
    plain.write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    with pytest.raises(AssertionError, match="the launcher was built"):
        launch(nothing_starts, str(plain), "--bad")
    assert not (tmp_path / "imported").exists()


def test_a_module_name_given_as_a_script_suggests_dash_m(nothing_starts, capsys):
    assert launch(nothing_starts, "paramshard.apps.ctr", "--train", "t.csv") == 2
    err = capsys.readouterr().err
    assert "training script 'paramshard.apps.ctr' not found" in err and "give -m paramshard.apps.ctr" in err
    assert launch(nothing_starts, "train.py") == 2            # a file name: no -m hint
    err = capsys.readouterr().err
    assert "training script 'train.py' not found" in err and "-m" not in err
