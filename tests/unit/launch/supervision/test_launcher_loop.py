"""One run's supervision loop (launch/supervision/launcher.py) over processes that implement the
Process protocol (launch/engines/process.py) and nothing more: no real process, no sleep."""
import dataclasses
import logging
import signal

from paramshard.env import ClusterEnv
from paramshard.launch.api import JobSpec, RankSpec
from paramshard.launch.supervision.launcher import Launcher
from paramshard.launch.supervision.listeners import JobListeners
from paramshard.messages.status_lines import PEER_LOST_EXIT_CODE


class Rank:
    def __init__(self, tag, code=None, lines=()):
        self.tag, self.code, self.lines, self.pid = tag, code, list(lines), 7
        self.withheld: list[str] = []
        self.held = self.muted = False
        self.ended_at = None

    def poll(self):
        return self.code

    def describe_exit(self):
        return f"{self.tag} exited with code {self.code}"

    def last_status(self):
        return None, None

    def error_excerpt(self):
        return self.lines

    def failed_at(self):
        return None

    def hold_tracebacks(self):
        self.held = True

    def mute(self):
        self.muted = True

    def kill(self):
        self.code = -signal.SIGKILL


class Engine:
    def __init__(self, plan):
        self.plan = plan            # rank name -> (code, lines) it has ended with by the first look

    def start(self, rank):
        return Rank(rank.name, *self.plan.get(rank.name, (None, ())))

    def stop(self, processes, grace, hurry):
        for p in processes:
            if p.code is None:
                p.code = -signal.SIGTERM


def _spec(servers=2, trainers=2, **env):
    base = ClusterEnv(role=None, servers=("127.0.0.1:1",) * servers, num_trainers=trainers, timeout=3.0, **env)
    return JobSpec(tuple(RankSpec(f"server {i}", dataclasses.replace(base, role="server", server_id=i), ("x",))
                         for i in range(servers)),
                   tuple(RankSpec(f"trainer {i}", dataclasses.replace(base, role="trainer", trainer_id=i), ("x",))
                         for i in range(trainers)))


def test_a_failed_trainer_stops_the_job_with_its_code_and_the_summary_names_it(caplog):
    launcher = Launcher(Engine({"trainer 1": (3, ["ValueError: boom"])}))
    launcher.start_job(_spec())
    with caplog.at_level(logging.INFO, logger="paramshard.launch"):
        assert launcher.wait(poll_interval=0) == 3
    assert all(p.muted for p in launcher.servers + launcher.trainers)
    assert all(p.held for p in launcher.servers + launcher.trainers if p.tag != "trainer 1")
    assert "first failure: trainer 1 (exit code 3; pid 7 on this machine)\n    ValueError: boom" in caplog.text


def test_the_root_cause_is_not_the_server_that_only_lost_a_peer():
    launcher = Launcher(Engine({"server 0": (PEER_LOST_EXIT_CODE, ()), "server 1": (-signal.SIGKILL, ())}))
    launcher.start_job(_spec())
    assert launcher.wait(poll_interval=0) == 128 + signal.SIGKILL


def test_every_trainer_done_the_job_succeeds():
    plan = {"trainer 0": (0, ()), "trainer 1": (0, ()), "server 0": (0, ()), "server 1": (0, ())}
    launcher = Launcher(Engine(plan))
    launcher.start_job(_spec())
    assert launcher.wait(poll_interval=0) == 0


def test_an_in_place_restart_is_told_to_the_listeners_with_the_rank_and_why(tmp_path):
    from paramshard.launch.supervision.restart_policy import RestartPolicy

    class Restarting(Engine):
        """server 1 is killed the first time; its restart and everyone else end well."""
        started = 0

        def start(self, rank):
            if rank.name == "server 1":
                self.started += 1
                return Rank(rank.name, -signal.SIGKILL if self.started == 1 else 0)
            return Rank(rank.name, 0)

    (tmp_path / "step-00000005").mkdir()
    (tmp_path / "step-00000005" / "manifest.json").write_text("{}")
    told = []
    launcher = Launcher(Restarting({}), policy=RestartPolicy(max_restarts=1), checkpoint_dir=str(tmp_path),
                        listeners=JobListeners(restarted=(lambda rank, why: told.append((rank, why)),)))
    launcher.start_job(_spec())
    assert launcher.wait(poll_interval=0) == 0
    assert [rank for rank, _ in told] == ["server 1"]
    why = told[0][1]
    assert f"exited with code {-signal.SIGKILL}" in why and "restarting it in place" in why and "step-00000005" in why


def test_once_the_trainers_finished_scale_is_told_the_job_ended_without_waiting(tmp_path):
    import pytest

    from paramshard.errors import ConfigError
    from paramshard.launch.elastic.control_channel import send

    plan = {"trainer 0": (0, ()), "trainer 1": (0, ()), "server 0": (0, ()), "server 1": (0, ())}
    launcher = Launcher(Engine(plan), control_dir=tmp_path)
    launcher.start_job(_spec())
    assert launcher.wait(poll_interval=0) == 0

    def no_wait(seconds):
        raise AssertionError("scale waited for a launcher that had stopped answering")
    with pytest.raises(ConfigError, match=r"the job ended at .* \(its trainers finished\)"):
        send(tmp_path, "servers", 3, sleep=no_wait)
    assert launcher.job_ended()


def test_a_dead_trainer_does_not_close_the_control_channel():
    """Dead trainers of an elastic job may be replaced: only trainers that all succeeded end it."""
    launcher = Launcher(Engine({"trainer 0": (0, ()), "trainer 1": (-signal.SIGKILL, ())}))
    launcher.start_job(_spec())
    assert launcher.job_ended() and not launcher.trainers_done()
    launcher.trainers[1].code = 0
    assert launcher.trainers_done()


class _Keeper:
    """A bounded-loss job's replica keeper that always has something to restore: a server the
    loop takes for hung would be SIGKILLed and restarted."""
    def latest(self):
        from pathlib import Path
        return Path("replica")

    def note_lost(self, server, at):
        pass

    def stop(self):
        pass


def _exiting_servers(launcher, silent_for, said_stopping):
    """The end of a job: server 1 stopped serving first (its peer watch closed: ``said_stopping``,
    the lines a real PeerWatch writes) and takes long to exit, silent ``silent_for`` s; server 0,
    still up, lost its heartbeat and names it."""
    import time

    import zmq

    from paramshard.messages.status_lines import PeerStatus
    from paramshard.server.core.peers import PeerWatch

    lines = []
    ctx = zmq.Context()
    try:
        watch = PeerWatch(ctx, {0: "127.0.0.1:9"}, grace=60.0, me=1, report=lines.append)
        watch.poll()
        if said_stopping:
            watch.close()
        else:
            for peer in watch.peers:
                peer.sock.close(0)
                peer.monitor.close(0)
    finally:
        ctx.term()
    now = time.monotonic()
    last = {1: (PeerStatus.parse(lines[-1]), now - silent_for), 0: (PeerStatus(0, {1: silent_for}), now)}
    for i, server in enumerate(launcher.servers):
        server.last_status = lambda i=i: last[i]


def _trainers_exit_after_the_first_look(launcher):
    """The interleaving: the loop's first look is taken while the trainers are still exiting;
    they (and the servers) have exited by its next look."""
    look, looks = launcher._peer_verdict, []

    def verdict():
        looks.append(1)
        if len(looks) == 2:
            for p in launcher.trainers + launcher.servers:
                p.code = 0
        return look()
    launcher._peer_verdict = verdict


def _servers_exit_after_the_first_look(launcher):
    """What real servers do once every trainer has left: exit on their own. The loop's first look
    (its verdict on the peers) sees them still up; without their exit, the job's end would wait
    out its 10 s for them (Launcher._finish)."""
    look = launcher._peer_verdict

    def verdict():
        seen = look()
        for server in launcher.servers:
            if server.code is None:
                server.code = 0
        return seen
    launcher._peer_verdict = verdict


def _ending_job(silent_for, said_stopping, trainers_exited):
    from paramshard.launch.supervision.peer_loss import SILENT_AFTER
    from paramshard.launch.supervision.restart_policy import RestartPolicy

    told = []
    launcher = Launcher(Engine({} if not trainers_exited else {"trainer 0": (0, ()), "trainer 1": (0, ())}),
                        policy=RestartPolicy(max_restarts=2), replica_keeper=lambda env, record: _Keeper(),
                        listeners=JobListeners(restarted=(lambda rank, why: told.append((rank, why)),)))
    launcher.start_job(_spec(recovery="bounded-loss"))
    _exiting_servers(launcher, silent_for * SILENT_AFTER, said_stopping)
    if not trainers_exited:
        _trainers_exit_after_the_first_look(launcher)
    else:
        _servers_exit_after_the_first_look(launcher)
    return launcher, told


def test_a_server_slow_to_exit_at_the_end_of_its_job_is_not_killed_as_hung():
    """Issue 30 (7d): a bounded-loss job's normal end SIGKILLed an exiting server as "hung" and
    restarted it: it had closed its peer watch (so server 0 named it at once), stopped writing
    status lines, and took longer than SILENT_AFTER to exit while the trainers were exiting too.
    Its last status line now says it is stopping."""
    launcher, told = _ending_job(silent_for=2, said_stopping=True, trainers_exited=False)
    server = launcher.servers[1]
    assert launcher.wait(poll_interval=0) == 0
    assert told == [] and launcher.restarts_used == 0 and launcher.servers[1] is server and server.code == 0


def test_once_every_trainer_succeeded_a_silent_named_server_ends_with_the_job_not_restarted():
    """The same end, seen only once the trainers have exited, from a server that never said it
    stops (one of another version): the job is over, nothing is restarted for it."""
    launcher, told = _ending_job(silent_for=2, said_stopping=False, trainers_exited=True)
    assert launcher.wait(poll_interval=0) == 0
    assert told == [] and launcher.restarts_used == 0


def test_a_server_hung_while_the_trainers_still_train_is_still_killed_and_restarted():
    """What the fix must not lose: silent, named, never said it stops, trainers still running."""
    launcher, told = _ending_job(silent_for=2, said_stopping=False, trainers_exited=False)
    hung = launcher.servers[1]
    assert launcher.wait(poll_interval=0) == 0
    assert hung.code == -signal.SIGKILL and [rank for rank, _ in told] == ["server 1"]
    assert "was hung and is killed" in told[0][1]


def _named_by_server_0(retired: set, caplog) -> list[str]:
    """Server 0's status names server 2 unreachable; server 2 is alive and reporting; the trainers
    finished. The launcher's warnings about server 2 as the job ends."""
    import time
    import types

    from paramshard.messages.status_lines import PeerStatus
    launcher = Launcher(Engine({"trainer 0": (0, ()), "trainer 1": (0, ())}),
                        server_scaler=lambda job: types.SimpleNamespace(retired=retired))
    launcher.start_job(_spec(servers=3))
    launcher.server_scaler()          # as a `paramshard scale --servers` makes it
    now = time.monotonic()
    last = {0: (PeerStatus(0, {2: 6.0}), now), 1: (PeerStatus(1, {}), now), 2: (PeerStatus(2, {}), now)}
    for i, server in enumerate(launcher.servers):
        server.last_status = lambda i=i: last[i]
    _servers_exit_after_the_first_look(launcher)
    with caplog.at_level(logging.WARNING, logger="paramshard"):
        assert launcher.wait(poll_interval=0) == 0
    return [r.getMessage() for r in caplog.records if "server 2" in r.getMessage()]


def test_a_server_a_scale_removed_is_not_reported_named_unreachable_at_the_end(caplog):
    """Issue 29 leftover: at the normal end of a scaled job the launcher warned 'named unreachable
    by server 0 but alive' about the server the scale had removed (retired: no peer of anyone)."""
    assert _named_by_server_0({2}, caplog) == []


def test_a_serving_server_named_unreachable_is_still_reported(caplog):
    assert any("named unreachable by server 0 but alive" in m for m in _named_by_server_0(set(), caplog))


def test_a_failed_job_tells_its_failure_summary_to_the_listeners_for_the_run_directory():
    told = []
    launcher = Launcher(Engine({"trainer 1": (3, ["ValueError: boom"])}),
                        listeners=JobListeners(events=(lambda event, text, **f: told.append((event, text, f)),)))
    launcher.start_job(_spec())
    assert launcher.wait(poll_interval=0) == 3
    failures = [(text, fields) for event, text, fields in told if event == "failure"]
    assert len(failures) == 1                     # once, with the summary the launcher printed
    text, fields = failures[0]
    assert text.startswith("first failure: trainer 1 (exit code 3; pid 7 on this machine)\n    ValueError: boom")
    assert fields == {"rank": "trainer 1", "exit_code": 3}
