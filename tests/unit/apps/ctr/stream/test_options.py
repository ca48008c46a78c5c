"""--stream's options: what does not combine with a stream is refused with the reason, by the same
resolve() the launcher's check runs (arguments.py); the schema must be fitted and binary."""
import pytest

from paramshard.apps.ctr import check_arguments
from paramshard.apps.ctr.options import parser, resolve
from paramshard.apps.ctr.stream.options import DEFAULT_REPORT_SECONDS, REFUSED
from paramshard.apps.ctr.stream.progressive import DEFAULT_WINDOW
from paramshard.data.features.presets import criteo_schema
from paramshard.errors import ConfigError
from paramshard.specs.schema import Column, Label, Schema

STREAM = ["--stream", "events/", "--schema", "x.json"]
# A value for each refused flag (the flag, then its value if it takes one).
VALUES = {"--train": "t.csv", "--test": "s.csv", "--valid": "v.csv", "--valid-fraction": "0.1", "--epochs": "3",
          "--patience": "2", "--monitor": "auc", "--lr-decay-after": "1", "--lr-decay-at": "2",
          "--weight": "w", "--group-by": "user", "--trained-log": "d"}


def args(argv):
    return resolve(parser("ctr").parse_args(argv))


def test_a_stream_run_takes_its_defaults_and_never_refits():
    a = args(STREAM + ["--max-events", "10"])
    assert (a.window, a.report_every, a.max_events, a.max_seconds) == (DEFAULT_WINDOW, DEFAULT_REPORT_SECONDS, 10, None)
    assert a.refit == "never"


@pytest.mark.parametrize("flag", [flag for _, flag, _ in REFUSED])
def test_every_flag_that_does_not_combine_is_refused_with_why(flag):
    assert flag in VALUES, "a refused flag without a test value"
    with pytest.raises(ConfigError, match=f"^{flag} does not combine with --stream: ."):
        args(STREAM + [flag, VALUES[flag]])


def test_refit_always_is_refused():
    with pytest.raises(ConfigError, match="--refit always does not combine with --stream: there is no selection"):
        args(STREAM + ["--refit", "always"])


@pytest.mark.parametrize("extra,message", [(["--max-events", "0"], "--max-events must be >= 1"),
                                           (["--max-seconds", "0"], "--max-seconds must be > 0"),
                                           (["--window", "0"], "--window must be >= 1"),
                                           (["--report-every", "-1"], "--report-every must be > 0")])
def test_bad_stream_values(extra, message):
    with pytest.raises(ConfigError, match=message):
        args(STREAM + extra)


@pytest.mark.parametrize("flag,value", [("--max-events", "5"), ("--max-seconds", "1"), ("--window", "9"),
                                        ("--report-every", "2")])
def test_stream_flags_without_a_stream_are_refused(flag, value):
    with pytest.raises(ConfigError, match=f"{flag} goes with --stream only"):
        args(["--train", "t.csv", "--test", "s.csv", "--schema", "x.json", flag, value])


def test_files_are_still_required_without_a_stream():
    with pytest.raises(ConfigError, match="required: --test \\(or --stream SOURCE\\)"):
        args(["--train", "t.csv", "--schema", "x.json"])


def test_the_launchers_check_wants_a_fitted_binary_schema(tmp_path):
    criteo_schema().save(tmp_path / "fitted.json")
    check_arguments(["--stream", "events/", "--schema", str(tmp_path / "fitted.json")])      # no files to look for
    Schema(Label("click"), [Column("price", transforms=["standardize"])]).save(tmp_path / "unfitted.json")
    with pytest.raises(ConfigError, match="price have no statistics, and a stream run does not fit them.*schema fit"):
        check_arguments(["--stream", "events/", "--schema", str(tmp_path / "unfitted.json")])
    Schema(Label("price"), [Column("shop", "categorical")], label_kind="regression").save(tmp_path / "reg.json")
    with pytest.raises(ConfigError, match="a regression label; --stream's progressive validation scores a binary"):
        check_arguments(["--stream", "events/", "--schema", str(tmp_path / "reg.json")])
    with pytest.raises(ConfigError, match="--epochs does not combine with --stream"):
        check_arguments(["--stream", "events/", "--schema", str(tmp_path / "fitted.json"), "--epochs", "2"],
                        files=False)
