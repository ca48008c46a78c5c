"""A move of partitions that meets the job's end (launch/elastic/elastic_servers.py with a fake JobControl
and a fake move that fails as the servers stop): the outcome is "the job ended during the move",
told at INFO and recorded so, never an ERROR asking the user to restart the job; a move failing
while the job runs is still an error."""
import logging

from paramshard.launch.elastic.elastic_servers import ElasticServers

from paramshard.launch.supervision.listeners import JobListeners

from tests.unit.launch.elastic.fake_job import FakeJob


def failing_move(env, addresses, servers, event):
    raise ConnectionError("server 2 (127.0.0.1:3) stopped answering: the network dropped; check that server's "
                          "log, then restart the job")


def scaled_up(trainer_exits, caplog):
    launcher = FakeJob()
    launcher.ended = all(code is not None for code in trainer_exits)    # every trainer exited
    servers = ElasticServers(launcher, scale=failing_move)
    with caplog.at_level(logging.INFO, logger="paramshard.launch"):
        servers.scale(3)
        servers.move.join(5)
    return launcher, servers


def test_a_move_cut_by_the_jobs_end_says_the_job_ended_not_restart_it(caplog):
    launcher, servers = scaled_up([0, 0], caplog)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert "the job ended during the move of partitions to servers [0, 1, 2]" in caplog.text
    assert "restart the job" not in caplog.text
    [((event, text), fields)] = launcher.events
    assert event == "scale_failed" and fields["job_ended"] is True and "nothing to restart" in text
    assert servers.serving == [0, 1]


def test_a_move_failing_while_the_job_runs_is_still_an_error(caplog):
    launcher, _ = scaled_up([0, None], caplog)        # trainer 1 still trains
    assert [r.levelno for r in caplog.records if "moving partitions" in r.getMessage()] == [logging.ERROR]
    [((event, _), fields)] = launcher.events
    assert event == "scale_failed" and "job_ended" not in fields


def test_a_move_still_under_way_as_the_job_ends_is_said_once_as_the_jobs_end(tmp_path, caplog):
    """The job's watch (observe/live/job_watch.py) asks the Launcher as the job ends; the move's own
    failure, coming later, says nothing more."""
    import io
    import json
    import threading

    from paramshard.launch.supervision.launcher import Launcher
    from paramshard.observe.live.job_watch import JobWatch
    from tests.unit.launch.supervision.test_launcher_loop import Engine, _spec

    gate = threading.Event()

    def move_cut_late(env, addresses, servers, event):
        gate.wait(5)
        failing_move(env, addresses, servers, event)

    class Here:
        """A placement on this machine (new servers on made-up ports)."""
        on_hosts = False

        def new_server_address(self, host=None):
            return "127.0.0.1:3"

        def place_rank(self, rank):
            return rank
    events = []
    launcher = Launcher(Engine({"trainer 0": (0, ())}), Here(),
                        server_scaler=lambda job: ElasticServers(job, scale=move_cut_late),
                        listeners=JobListeners(events=(lambda *a, **f: events.append((a, f)),)))
    launcher.start_job(_spec(servers=2, trainers=1, partitions=256))
    watch = JobWatch(tmp_path / "run", "job-m", out=io.StringIO())
    with caplog.at_level(logging.INFO, logger="paramshard.launch"):
        launcher._scale_servers(3)                # what `paramshard scale --servers 3` asks
        watch._unfinished_move(launcher)          # the job ends while the move still runs
        gate.set()
        launcher.server_scaler().move.join(5)     # then the move fails as its servers stop
    watch.run.close()
    told = [r for r in caplog.records if "the job ended during the move" in r.getMessage()]
    assert [r.levelno for r in told] == [logging.INFO], caplog.text      # once, and not an error
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(e["event"], e["job_ended"]) for e in lines] == [("scale_failed", True)]
    assert events == []                           # the move's own failure added nothing
