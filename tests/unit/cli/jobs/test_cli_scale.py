"""cli/jobs/scale.py: which requests `paramshard scale` sends, in which order (a host first, so the ranks
asked for next may go there), and what it refuses before sending anything."""
import argparse

import pytest

from paramshard.cli.jobs import scale
from paramshard.errors import ConfigError


def parse(*argv):
    p = argparse.ArgumentParser()
    scale.add_arguments(p)
    return p.parse_args(argv)


@pytest.fixture
def sent(monkeypatch, tmp_path):
    out = []
    monkeypatch.setattr(scale, "send", lambda run_dir, kind, value, timeout, host=None:
                        out.append((kind, value) + ((host,) if host else ())) or "ok")
    return out


def test_a_host_is_added_before_the_ranks_asked_for(sent, tmp_path):
    assert scale.run(parse(str(tmp_path), "--add-host", "u@10.0.0.3:2222 slots=2", "--servers", "3")) == 0
    assert sent == [("add_host", "u@10.0.0.3:2222 slots=2"), ("servers", 3)]
    sent.clear()
    scale.run(parse(str(tmp_path), "--add-host", "10.0.0.4"))
    scale.run(parse(str(tmp_path), "--trainers", "2"))
    assert sent == [("add_host", "10.0.0.4"), ("trainers", 2)]


def test_nothing_or_both_counts_are_refused_before_anything_is_sent(sent, tmp_path):
    for argv in ((), ("--trainers", "2", "--servers", "3"), ("--add-host", "h", "--trainers", "2", "--servers", "3")):
        with pytest.raises(ConfigError, match="give one of --trainers N or --servers N, and/or --add-host HOST"):
            scale.run(parse(str(tmp_path), *argv))
    assert sent == []


def test_on_names_the_host_of_new_servers_and_needs_servers(sent, tmp_path):
    scale.run(parse(str(tmp_path), "--add-host", "10.0.0.3", "--servers", "3", "--on", "10.0.0.3"))
    assert sent == [("add_host", "10.0.0.3"), ("servers", 3, "10.0.0.3")]
    with pytest.raises(ConfigError, match="--on HOST places new servers: give it with --servers N"):
        scale.run(parse(str(tmp_path), "--trainers", "2", "--on", "10.0.0.3"))


def write_config(run_dir, **launch):
    import json
    (run_dir / "control").mkdir(exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps({"job_id": "j", "launch": launch}))


def test_a_job_not_launched_elastic_is_told_how_to_launch_one_without_asking_the_launcher(sent, tmp_path):
    write_config(tmp_path, trainers=2, min_trainers=None, partitions=0)
    with pytest.raises(ConfigError, match=r"--trainers 3: this job is not elastic; launch it with --trainers MIN:MAX "
                                          r"\(e.g. --trainers 1:3\) .*launched with --trainers 2"):
        scale.run(parse(str(tmp_path), "--trainers", "3"))
    with pytest.raises(ConfigError, match=r"--servers 3: .*fixed hash; launch it with --partitions P"):
        scale.run(parse(str(tmp_path), "--servers", "3"))
    assert sent == []
    write_config(tmp_path, trainers=3, min_trainers=1, partitions=1024)      # elastic both ways: asked
    scale.run(parse(str(tmp_path), "--trainers", "2"))
    scale.run(parse(str(tmp_path), "--servers", "2"))
    assert sent == [("trainers", 2), ("servers", 2)]


def test_an_ended_job_is_answered_with_its_end_without_asking(sent, tmp_path):
    import json
    write_config(tmp_path, trainers=3, min_trainers=1, partitions=1024)
    (tmp_path / "summary.json").write_text(json.dumps({"job_id": "j", "ended": 1_790_000_000.0, "exit_code": 0,
                                                       "duration_s": 12.3}))
    for argv in (("--servers", "3"), ("--trainers", "2"), ("--add-host", "h")):
        with pytest.raises(ConfigError, match=r"the job j ended at .* \(exit code 0, after 12 s\): there is nothing "
                                              r"to change"):
            scale.run(parse(str(tmp_path), *argv))
    assert sent == []


def test_remove_host_is_sent_alone_and_the_launchers_answer_shown(sent, tmp_path, capsys):
    write_config(tmp_path, trainers=3, min_trainers=1, partitions=1024)
    assert scale.run(parse(str(tmp_path), "--remove-host", "10.0.0.3")) == 0
    assert sent == [("remove_host", "10.0.0.3")] and capsys.readouterr().out == "ok\n"


@pytest.mark.parametrize("extra", [("--trainers", "2"), ("--servers", "2"), ("--add-host", "h"),
                                   ("--servers", "2", "--on", "h")])
def test_remove_host_with_another_change_is_refused_before_anything_is_sent(sent, tmp_path, extra):
    with pytest.raises(ConfigError, match=r"--remove-host 10.0.0.3: give it alone \(not with --.*\); once its "
                                          r"trainers left, `scale --trainers N` starts others on the remaining hosts"):
        scale.run(parse(str(tmp_path), "--remove-host", "10.0.0.3", *extra))
    assert sent == []


def test_remove_host_on_an_ended_job_is_answered_without_asking(sent, tmp_path):
    import json
    write_config(tmp_path, trainers=3, min_trainers=1, partitions=1024)
    (tmp_path / "summary.json").write_text(json.dumps({"job_id": "j", "ended": 1_790_000_000.0, "exit_code": 0}))
    with pytest.raises(ConfigError, match=r"the job j ended at .*: there is nothing to change"):
        scale.run(parse(str(tmp_path), "--remove-host", "10.0.0.3"))
    assert sent == []


def test_the_launchers_refusal_of_remove_host_reaches_the_user(tmp_path):
    """Through the real channel: a launcher that is not an SSH one (the base Launcher's handler)
    answers why, and the command shows it as its error."""
    import threading
    from paramshard.launch.elastic.control_channel import ControlChannel
    from paramshard.launch.supervision.launcher import Launcher
    tmp_path.chmod(0o700)
    write_config(tmp_path, trainers=3, min_trainers=1, partitions=1024)
    channel = ControlChannel(tmp_path)
    channel.register("remove_host", Launcher(engine=None)._remove_host, value_type=str)
    stop = threading.Event()

    def launcher_loop():
        while not stop.is_set():
            channel.poll()
            stop.wait(0.02)
    poller = threading.Thread(target=launcher_loop)
    poller.start()
    try:
        with pytest.raises(ConfigError, match=r"--remove-host 10.0.0.3: this job was not launched over SSH"):
            scale.run(parse(str(tmp_path), "--remove-host", "10.0.0.3", "--wait", "10"))
    finally:
        stop.set()
        poller.join(5)
