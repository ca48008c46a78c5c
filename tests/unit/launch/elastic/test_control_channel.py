"""launch/elastic/control_channel.py: a request written by the command, answered by the launcher's poll
(a thread-free fake: the command's sleep runs one poll), errors naming what to do."""
import json

import pytest

from paramshard.errors import ConfigError, DeadlineExceeded
from paramshard.launch.elastic.control_channel import ControlChannel, resolve_run_dir, send


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def polling(channel, clock):
    """The command's sleep: the launcher's loop polls meanwhile."""
    def sleep(seconds):
        clock.now += seconds
        channel.poll()
    return sleep


def test_a_request_reaches_its_handler_and_the_reply_comes_back(tmp_path):
    seen = []
    channel = ControlChannel(tmp_path, {"trainers": lambda n: seen.append(n) or f"now {n} trainers"})
    clock = Clock()
    assert send(tmp_path, "trainers", 3, clock=clock, sleep=polling(channel, clock)) == "now 3 trainers"
    assert seen == [3] and list((tmp_path / "control").iterdir()) == []
    assert channel.requests == [("trainers", 3, True, "now 3 trainers")]


def test_a_refusal_is_the_commands_error(tmp_path):
    def refuse(n):
        raise ConfigError(f"--trainers {n}: outside 2:3")
    channel = ControlChannel(tmp_path, {"trainers": refuse})
    def not_elastic(n):
        raise ConfigError(f"--servers {n}: launch it with --partitions P")
    channel.register("servers", not_elastic)
    clock = Clock()
    with pytest.raises(ConfigError, match="outside 2:3"):
        send(tmp_path, "trainers", 9, clock=clock, sleep=polling(channel, clock))
    with pytest.raises(ConfigError, match="launch it with --partitions P"):
        send(tmp_path, "servers", 4, clock=clock, sleep=polling(channel, clock))
    with pytest.raises(ConfigError, match="does not handle 'memory'"):
        send(tmp_path, "memory", 4, clock=clock, sleep=polling(channel, clock))


def test_no_launcher_answers_the_command_gives_up_at_its_deadline(tmp_path):
    ControlChannel(tmp_path)
    clock = Clock()

    def sleep(seconds):
        clock.now += seconds
    with pytest.raises(DeadlineExceeded, match="the job has not ended there .*was its `paramshard launch` killed"):
        send(tmp_path, "trainers", 2, timeout=1.0, clock=clock, sleep=sleep)
    assert list((tmp_path / "control").iterdir()) == []      # the unanswered request is taken back


def test_not_a_run_directory_and_hostile_requests(tmp_path):
    with pytest.raises(ConfigError, match="no control/ directory"):
        send(tmp_path, "trainers", 2)
    channel = ControlChannel(tmp_path, {"trainers": lambda n: "ok"})
    folder = tmp_path / "control"
    (folder / "request-a1.json").write_text("x" * 5000)
    (folder / "request-b2.json").write_text(json.dumps({"kind": "trainers", "value": "3"}))
    (folder / "request-c3.json").write_text("[1, 2]")
    assert channel.poll() == 3
    replies = {p.name: json.loads(p.read_text()) for p in folder.glob("reply-*.json")}
    assert "larger than 4096" in replies["reply-a1.json"]["message"]
    assert "whole number" in replies["reply-b2.json"]["message"]
    assert "not a JSON object" in replies["reply-c3.json"]["message"]
    assert not any(r["ok"] for r in replies.values())


def test_a_job_id_names_its_newest_run_directory(tmp_path):
    runs = tmp_path / "runs"
    for stamp in ("20260101-000000", "20260102-000000"):
        (runs / f"{stamp}-job7").mkdir(parents=True)
    assert resolve_run_dir("job7", runs) == runs / "20260102-000000-job7"
    assert resolve_run_dir(str(runs / "20260101-000000-job7"), runs) == runs / "20260101-000000-job7"
    with pytest.raises(ConfigError, match="no such job"):
        resolve_run_dir("job8", runs)


def test_a_kind_registered_with_text_values_takes_text_and_only_text(tmp_path):
    channel = ControlChannel(tmp_path, {"trainers": lambda n: "ok"})
    channel.register("add_host", lambda host: f"added {host}", value_type=str)
    clock = Clock()
    assert send(tmp_path, "add_host", "10.0.0.3", clock=clock, sleep=polling(channel, clock)) == "added 10.0.0.3"
    with pytest.raises(ConfigError, match="'add_host' request's value must be text"):
        send(tmp_path, "add_host", 3, clock=clock, sleep=polling(channel, clock))
    with pytest.raises(ConfigError, match="1 to 256 characters"):
        send(tmp_path, "add_host", "h" * 300, clock=clock, sleep=polling(channel, clock))
    with pytest.raises(ConfigError, match="'trainers' request's value must be a whole number"):
        send(tmp_path, "trainers", "3", clock=clock, sleep=polling(channel, clock))


def test_a_host_reaches_only_the_kinds_that_place_on_one(tmp_path):
    channel = ControlChannel(tmp_path, {"trainers": lambda n: "ok"})
    channel.register("servers", lambda n, host=None: f"{n} servers, new ones on {host}", takes_host=True)
    clock = Clock()
    assert send(tmp_path, "servers", 3, clock=clock, sleep=polling(channel, clock), host="h3") == \
        "3 servers, new ones on h3"
    assert send(tmp_path, "servers", 3, clock=clock, sleep=polling(channel, clock)) == "3 servers, new ones on None"
    with pytest.raises(ConfigError, match="cannot place 'trainers' on a named host"):
        send(tmp_path, "trainers", 2, clock=clock, sleep=polling(channel, clock), host="h3")
    (tmp_path / "control" / "request-d4.json").write_text(json.dumps({"kind": "servers", "value": 3, "host": 7}))
    channel.poll()
    assert "host must be 1 to 256 characters of text" in json.loads(
        (tmp_path / "control" / "reply-d4.json").read_text())["message"]


def no_wait(seconds):
    raise AssertionError("the command waited for a launcher although the run directory says the job ended")


def test_a_job_that_ended_is_answered_at_once_with_its_end(tmp_path):
    ControlChannel(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({"job_id": "job7", "ended": 1_790_000_000.0,
                                                       "duration_s": 42.0, "exit_code": 0}))
    with pytest.raises(ConfigError, match=r"the job job7 ended at 20\d\d-.* \(exit code 0, after 42 s\)"):
        send(tmp_path, "servers", 3, sleep=no_wait)
    assert list((tmp_path / "control").iterdir()) == []         # nothing was asked


def test_a_request_racing_the_end_is_answered_the_job_ended(tmp_path):
    """The launcher's loop stops answering when the trainers finish (ControlChannel.close): a
    request waiting then, and any after, is answered "the job ended", never left to time out."""
    channel = ControlChannel(tmp_path, {"trainers": lambda n: "ok"})
    clock = Clock()

    def finishing(seconds):          # the job ends while the command waits
        clock.now += seconds
        channel.close("its trainers finished")
    with pytest.raises(ConfigError, match=r"ended \(its trainers finished\) before this request was acted on"):
        send(tmp_path, "trainers", 2, clock=clock, sleep=finishing)
    with pytest.raises(ConfigError, match=r"the job ended at .* \(its trainers finished\)"):
        send(tmp_path, "trainers", 2, sleep=no_wait)
    assert [p.name for p in (tmp_path / "control").iterdir()] == ["ended.json"]
    ControlChannel(tmp_path, {"trainers": lambda n: f"now {n}"})      # the job run again here: it answers
    assert not (tmp_path / "control" / "ended.json").exists()


def test_a_summary_written_while_waiting_ends_the_wait(tmp_path):
    ControlChannel(tmp_path)            # a launcher that never polls (e.g. stuck in its last seconds)
    clock = Clock()

    def ends(seconds):
        clock.now += seconds
        (tmp_path / "summary.json").write_text(json.dumps({"ended": 1_790_000_000.0, "exit_code": 1}))
    with pytest.raises(ConfigError, match=r"ended at .* \(exit code 1\) before it took this request"):
        send(tmp_path, "trainers", 2, clock=clock, sleep=ends)
    assert clock.now < 1.0 and list((tmp_path / "control").iterdir()) == []


def test_a_request_that_comes_once_every_trainer_exited_is_not_acted_on(tmp_path):
    """The trainers exited but the launcher's loop has not seen it yet: a server started for
    the request would be stopped with the job at once; it is answered "the job ended"."""
    over, acted = [False], []
    channel = ControlChannel(tmp_path, {"servers": lambda n: acted.append(n) or f"{n} servers"},
                             ending=lambda: over[0])
    clock = Clock()
    assert send(tmp_path, "servers", 3, clock=clock, sleep=polling(channel, clock)) == "3 servers"
    over[0] = True
    with pytest.raises(ConfigError, match=r"ended \(its trainers finished\) before this request was acted on"):
        send(tmp_path, "servers", 2, clock=clock, sleep=polling(channel, clock))
    assert acted == [3]


def test_a_job_id_names_its_own_run_directory_exactly_never_by_a_pattern(tmp_path):
    runs = tmp_path / "runs"
    for name in ("20260101-000000-job-ab12", "20260102-000000-job-ab34", "20260103-000000-x-job-ab12"):
        (runs / name).mkdir(parents=True)
    assert resolve_run_dir("job-ab12", runs) == runs / "20260101-000000-job-ab12"   # not x-job-ab12's
    for pattern in ("job-a*", "job-ab?2", "job-ab[13]4", "ab12", "*"):
        with pytest.raises(ConfigError, match="no such job"):
            resolve_run_dir(pattern, runs)
