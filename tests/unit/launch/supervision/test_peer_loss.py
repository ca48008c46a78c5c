"""Which servers the launcher kills and restarts when servers lose each other
(launch/supervision/peer_loss.py), the status lines that tell it (messages/status_lines.py,
server/core/peers.py), and the Launcher acting on them, with fake processes."""
import dataclasses
import io

from paramshard.env import ClusterEnv
from paramshard.launch.api import JobSpec, Launcher, RankSpec, failure_summary, first_failure, lost_a_peer
from paramshard.launch.supervision.restart_policy import RestartPolicy
from paramshard.launch.supervision.peer_loss import SILENT_AFTER, ServerState, decide
from paramshard.launch.engines.processes import Child
from paramshard.messages.status_lines import PEER_LOST_EXIT_CODE, STATUS_MARK, PeerStatus
from paramshard.server.core.peers import PeerWatch

LOST = PEER_LOST_EXIT_CODE
QUIET = SILENT_AFTER + 3.0     # a server silent to the launcher that long is hung if a peer names it
TALKING = 0.4                  # its last status line came this long ago
STOOD = SILENT_AFTER + 0.5     # an accusation this old is judged: the accused had time to say it stops


# -- the decision -------------------------------------------------------------------------------------

def test_a_named_server_silent_to_the_launcher_is_hung_and_only_it_restarts():
    v = decide([ServerState(0, names={1: 0.2}, silent_for=TALKING), ServerState(1, silent_for=QUIET)])
    assert v.hung[1] == f"hung: server 0 lost its heartbeat, and it has said nothing to the launcher for {QUIET:.1f} s"
    assert v.restart == (1,) and v.cost == 1 and v.casualties == () and v.dead == ()


def test_the_peer_that_exited_for_the_hung_one_in_the_same_tick_comes_back_free():
    v = decide([ServerState(0, code=LOST, names={1: 3.1}, gone=(1,), silent_for=0.1),
                ServerState(1, silent_for=QUIET)])
    assert set(v.hung) == {1} and v.casualties == (0,) and v.dead == ()
    assert v.restart == (0, 1) and v.cost == 1              # one incident, one restart


def test_two_servers_naming_each_other_while_both_report_is_a_partition_nobody_is_killed():
    v = decide([ServerState(0, names={1: STOOD}, silent_for=TALKING), ServerState(1, names={0: STOOD}, silent_for=TALKING)])
    assert v.hung == {} and v.restart == () and v.cost == 0
    assert v.partitions == ((0, 1),)
    assert "partition" in v.spared[0] and "partition" in v.spared[1]


def test_a_server_named_a_moment_ago_and_still_reporting_is_not_judged_yet():
    """Issue 32 (4): its last line, saying it stops, may still be in its pipe (each server's lines come
    over a pipe of their own, in no order with the others'): no verdict, so no warning, until the
    accusation has stood SILENT_AFTER s, counted from the accuser's seconds plus its line's age."""
    fresh = SILENT_AFTER - 0.5                         # + its line's age TALKING: 0.1 s short of judged
    for named in ({1: fresh}, {1: 0.05}):
        v = decide([ServerState(0, names=named, silent_for=TALKING), ServerState(1, names={0: 0.05}, silent_for=TALKING)])
        assert v.spared == {} and v.partitions == () and v.hung == {} and v.restart == ()
    v = decide([ServerState(0, names={1: fresh}, silent_for=TALKING + 0.2), ServerState(1, silent_for=TALKING)])
    assert "still reports to the launcher" in v.spared[1]   # the same line 0.2 s later: it stood
    v = decide([ServerState(0, names={1: 0.05}, silent_for=TALKING), ServerState(1, silent_for=QUIET)])
    assert set(v.hung) == {1}                          # silence needs no waiting: a hung one is hung at once


def test_two_servers_that_exited_naming_each_other_are_not_each_others_excuse():
    v = decide([ServerState(0, code=LOST, gone=(1,)), ServerState(1, code=LOST, gone=(0,))])
    assert v.hung == {} and v.casualties == () and v.dead == (0, 1) and v.cost == 2


def test_a_named_server_that_still_reports_is_spared_and_its_accuser_exiting_is_charged():
    alive = ServerState(1, silent_for=TALKING)
    v = decide([ServerState(0, names={1: STOOD}, silent_for=TALKING), alive])
    assert v.hung == {} and v.partitions == () and "still reports to the launcher" in v.spared[1]
    v = decide([ServerState(0, code=LOST, gone=(1,)), alive])
    assert v.hung == {} and v.dead == (0,) and v.casualties == () and v.cost == 1


def test_a_server_that_has_not_reported_yet_is_never_hung():
    v = decide([ServerState(0, names={1: 9.0}, silent_for=TALKING), ServerState(1, silent_for=None)])
    assert v.hung == {} and "before its first status line" in v.spared[1]


def test_a_silent_server_nobody_names_is_left_alone():
    # Busy in a long handler: its loop writes nothing, but libzmq still answers the heartbeats.
    assert decide([ServerState(0, silent_for=TALKING), ServerState(1, silent_for=QUIET)]).restart == ()


def test_a_killed_server_costs_one_and_its_peer_exiting_later_for_it_costs_nothing():
    v = decide([ServerState(0, names={1: 0.1}, silent_for=TALKING), ServerState(1, code=-9)])
    assert v.hung == {} and v.dead == (1,) and v.cost == 1
    # Later: the restarted server 1 did not come back within server 0's timeout.
    v = decide([ServerState(0, code=LOST, gone=(1,)), ServerState(1, silent_for=None)], just_restarted=[1])
    assert v.casualties == (0,) and v.dead == () and v.cost == 0 and v.restart == (0,)


def test_a_crash_is_dead_whatever_it_named_and_accuses_nobody():
    v = decide([ServerState(0, code=1, names={1: 2.0}), ServerState(1, silent_for=QUIET)])
    assert v.hung == {} and v.dead == (0,) and v.cost == 1


def test_three_servers_two_name_the_hung_one_one_restart():
    v = decide([ServerState(0, names={2: 0.3}, silent_for=TALKING), ServerState(1, names={2: 0.1}, silent_for=TALKING),
                ServerState(2, silent_for=QUIET)])
    assert set(v.hung) == {2} and v.hung[2].startswith("hung: server 0 and server 1 lost its heartbeat,") and v.cost == 1


# -- status lines -------------------------------------------------------------------------------------

def test_status_lines_round_trip_and_anything_else_is_not_one():
    status = PeerStatus(0, {1: 5.25}, (1,), unseen=(2,))
    line = status.line()
    assert line.startswith(STATUS_MARK) and line.endswith("\n") and "\n" not in line[:-1]
    assert PeerStatus.parse(line) == status
    assert PeerStatus.parse("server 0 | hello") is None
    assert PeerStatus.parse(STATUS_MARK + "{not json") is None
    assert PeerStatus.parse(STATUS_MARK + '{"unreachable": {}}') is None


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_peer_watch_writes_a_status_line_each_second_and_at_once_on_a_change():
    import zmq
    clock, lines = Clock(), []
    watch = PeerWatch(zmq.Context.instance(), {1: "127.0.0.1:1"}, grace=3.0, clock=clock, me=0, report=lines.append)
    peer = watch.peers[0]
    # This test drives the peer's state itself: the real connection's events (retries to a
    # closed port) arrive whenever libzmq makes them and would undo a state set here.
    real_monitor, peer.monitor = peer.monitor, Silent()
    try:
        assert watch.poll() == [] and [PeerStatus.parse(x) for x in lines] == [PeerStatus(0, unseen=(1,))]
        clock.now += 0.5
        watch.poll()
        assert len(lines) == 1                           # nothing changed, not a second yet
        peer.reachable = peer.ever_reachable = True      # as a handshake would: said at once
        watch.poll()
        assert len(lines) == 2 and PeerStatus.parse(lines[-1]) == PeerStatus(0)
        peer.reachable, peer.down_since = False, clock.now      # then the heartbeat is lost:
        clock.now += 0.25
        watch.poll()
        assert PeerStatus.parse(lines[-1]) == PeerStatus(0, {1: 0.25})    # at once
        clock.now += 1.0
        watch.poll()
        assert PeerStatus.parse(lines[-1]) == PeerStatus(0, {1: 1.25})    # the second's beat
        clock.now += 2.0
        assert watch.poll() == ["server 1 (127.0.0.1:1)"]
        assert PeerStatus.parse(lines[-1]) == PeerStatus(0, {1: 3.25}, (1,))   # the peer it exits for
    finally:
        peer.monitor = real_monitor
        watch.close()
    # Its last word as it exits: what it said last (the peer it exits for too), and that it stops.
    assert PeerStatus.parse(lines[-1]) == PeerStatus(0, {1: 3.25}, (1,), stopping=True)
    said = len(lines)
    watch.close()
    assert len(lines) == said                                                   # said once


def test_a_named_silent_server_that_said_it_stops_is_exiting_not_hung():
    v = decide([ServerState(0, names={1: 4.0}, silent_for=0.1),
                ServerState(1, silent_for=SILENT_AFTER + 5, stopping=True)])
    assert v.hung == {} and v.restart == () and v.spared == {}


class Silent:
    """A monitor socket with no events."""
    def poll(self, timeout=0):
        return 0


def test_a_watch_without_a_launcher_reading_writes_nothing(monkeypatch, capsys):
    import zmq
    monkeypatch.delenv("PARAMSHARD_RECORDS", raising=False)
    watch = PeerWatch(zmq.Context.instance(), {1: "127.0.0.1:1"}, grace=3.0, me=0)
    watch.poll()
    watch.close()
    assert STATUS_MARK not in capsys.readouterr().out


def test_a_child_takes_status_lines_out_of_its_output(tmp_path):
    import sys
    out = io.StringIO()
    script = (f"import sys; sys.stdout.write('before\\n' + {PeerStatus(2, {0: 1.5}).line()!r} + 'after\\n')")
    child = Child("server 2", [sys.executable, "-c", script], env={"PATH": "/usr/bin:/bin"}, out=out)
    child.proc.wait(10)
    child._pump.join(10)
    status, at = child.last_status()
    assert status == PeerStatus(2, {0: 1.5}) and at is not None
    assert out.getvalue() == "server 2 | before\nserver 2 | after\n"


# -- the launcher acting on them ----------------------------------------------------------------------

class FakeProcess:
    def __init__(self, tag, status=None, status_age=TALKING):
        import time
        self.tag, self.code, self.pid, self.killed = tag, None, id(self) % 100000, False
        self.status, self.status_at = status, (time.monotonic() - status_age) if status is not None else None

    def poll(self):
        return self.code

    def describe_exit(self):
        return f"{self.tag} exited with code {self.code}"

    def last_status(self):
        return self.status, self.status_at

    def kill(self):
        self.killed, self.code = True, -9


class FakeEngine:
    def __init__(self, first=()):
        self.first = list(first)                 # the job's processes as it starts
        self.started: list[RankSpec] = []        # the ranks started after those (restarts)

    def start(self, rank):
        if self.first:
            return self.first.pop(0)
        self.started.append(rank)
        return FakeProcess(rank.name)

    def stop(self, processes, grace, hurry):
        for p in processes:
            if p.code is None:
                p.code = -15


def _launcher(tmp_path, restarts, servers):
    """A launcher whose job's servers are the processes ``servers`` (and no trainer)."""
    (tmp_path / "step-00000005").mkdir()
    (tmp_path / "step-00000005" / "manifest.json").write_text("{}")
    base = ClusterEnv(role=None, servers=("127.0.0.1:7001", "127.0.0.1:7002"), num_trainers=1, timeout=3.0)
    engine = FakeEngine(servers)
    launcher = Launcher(engine, policy=RestartPolicy(restarts), checkpoint_dir=str(tmp_path))
    launcher.start_job(JobSpec(tuple(RankSpec(f"server {i}", dataclasses.replace(base, role="server", server_id=i),
                                              ("x",)) for i in range(2)), ()))
    return launcher, engine


def test_the_launcher_kills_the_hung_server_restarts_it_alone_and_spends_one_restart(tmp_path):
    server0 = FakeProcess("server 0", PeerStatus(0, {1: 0.3}))
    hung = FakeProcess("server 1", PeerStatus(1), status_age=QUIET)
    launcher, engine = _launcher(tmp_path, 1, [server0, hung])
    assert launcher._restart_in_place([], launcher._peer_verdict())
    assert hung.killed and not server0.killed
    assert [r.name for r in engine.started] == ["server 1"]
    assert engine.started[0].env.recovering
    assert launcher.servers[0] is server0 and launcher.servers[1] is not hung
    assert (launcher.restarts_used, launcher.restarts_left) == (1, 0)
    assert len(launcher.incidents) == 1
    assert launcher.incidents[0].startswith("restart 1: server 1 (hung: server 0 lost its heartbeat, and it has said nothing")
    # server 0 then exits for the server just restarted (it did not come back in its timeout): free.
    server0.code, server0.status = LOST, PeerStatus(0, {1: 3.0}, (1,))
    assert launcher._restart_in_place([server0], launcher._peer_verdict())
    assert launcher.restarts_used == 1 and [r.name for r in engine.started] == ["server 1", "server 0"]


def test_without_restarts_left_the_launcher_waits_for_the_servers_timeout(tmp_path):
    hung = FakeProcess("server 1", PeerStatus(1), status_age=QUIET)
    launcher, engine = _launcher(tmp_path, 0, [FakeProcess("server 0", PeerStatus(0, {1: 0.3})), hung])
    assert not launcher._restart_in_place([], launcher._peer_verdict())
    assert not hung.killed and engine.started == []


def test_the_failure_summary_names_the_hung_server_not_the_one_that_lost_it():
    server0 = FakeProcess("server 0")
    server0.code = LOST
    assert lost_a_peer(server0)
    hung = FakeProcess("server 1")
    hung.code = -9
    assert first_failure([server0, hung]) is hung
    text = failure_summary(hung, [server0], why="hung: server 0 lost its heartbeat").splitlines()
    assert text[0].startswith("first failure: server 1 (hung: server 0 lost its heartbeat; "
                              "the launcher killed it: killed by SIGKILL;")
    assert any(line.startswith("  server 0: failed after server 1 (peer lost; exit code 69)") for line in text)
