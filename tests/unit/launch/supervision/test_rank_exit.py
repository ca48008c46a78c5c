"""How a rank ended (launch/supervision/rank_exit.py): the typed exit the supervision loop and the
failure summary read, "peer lost" included, from processes that implement the Process
protocol (launch/engines/process.py)."""
import signal

from paramshard.launch.supervision.rank_exit import RankExit, exit_status, failure_summary, first_failure
from paramshard.messages.status_lines import PEER_LOST_EXIT_CODE


class Rank:
    """Every member of the Process protocol, no process behind it."""

    def __init__(self, tag, code, lines=(), failed_at=None, ended_at=None, pid=42):
        self.tag, self.code, self.lines, self._failed_at, self.ended_at, self.pid = \
            tag, code, list(lines), failed_at, ended_at, pid
        self.withheld: list[str] = []

    def poll(self):
        return self.code

    def describe_exit(self):
        return f"{self.tag} exited with code {self.code}"

    def last_status(self):
        return None, None

    def error_excerpt(self):
        return self.lines

    def failed_at(self):
        return self._failed_at

    def hold_tracebacks(self):
        pass

    def mute(self):
        pass

    def kill(self):
        self.code = -signal.SIGKILL


def test_a_signal_is_data_and_the_status_is_what_a_shell_says():
    e = RankExit.of(Rank("trainer 1", -signal.SIGKILL))
    assert e.signal == signal.SIGKILL and e.status == 128 + 9 and e.stopped
    assert e.reason() == "killed by SIGKILL" and e.where() == "pid 42 on this machine"
    assert exit_status(3) == 3 and RankExit.of(Rank("trainer 0", 3)).signal is None


def test_a_server_exiting_with_the_peer_lost_code_lost_a_peer_a_trainer_with_it_did_not():
    assert RankExit.of(Rank("server 1", PEER_LOST_EXIT_CODE)).peer_lost
    assert not RankExit.of(Rank("trainer 1", PEER_LOST_EXIT_CODE)).peer_lost
    assert not RankExit.of(Rank("server 1", 1)).peer_lost


def test_a_remote_rank_names_its_host_and_an_ssh_failure():
    e = RankExit.of(Rank("10.0.0.2 | server 0", 255))
    assert (e.name, e.host, e.where()) == ("server 0", "10.0.0.2", "on 10.0.0.2")
    assert e.reason() == "exit code 255: ssh failed or lost its connection"
    assert RankExit.of(Rank("server 0", 255)).reason() == "exit code 255"
    assert RankExit.of(Rank("server 0", 137)).reason() == "exit code 137, i.e. 128 + SIGKILL?"


def test_the_first_failure_is_the_earliest_that_did_not_lose_a_peer():
    lost = Rank("server 0", PEER_LOST_EXIT_CODE, failed_at=1.0)
    late = Rank("trainer 0", 1, ["ValueError: late"], failed_at=3.0)
    early = Rank("trainer 1", 1, ["ValueError: early"], failed_at=2.0)
    assert first_failure([lost, late, early]) is early
    exits = [RankExit.of(p) for p in (lost, late, early)]
    assert first_failure(exits) is exits[2]


def test_the_summary_from_typed_exits():
    head = RankExit("trainer 1", 1, 7, excerpt=("ValueError: boom",))
    lost = RankExit("server 0", PEER_LOST_EXIT_CODE, peer_lost=True)
    stopped = RankExit("trainer 0", -signal.SIGTERM)
    assert failure_summary(head, [lost, stopped], stopped=[stopped]).splitlines() == [
        "first failure: trainer 1 (exit code 1; pid 7 on this machine)",
        "    ValueError: boom",
        "  server 0: failed after trainer 1 (peer lost; exit code 69)",
        "  trainer 0: failed after trainer 1 (then stopped by the launcher)"]
