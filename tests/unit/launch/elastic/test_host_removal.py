"""launch/elastic/host_removal.py: which servers and trainers `scale --remove-host HOST` takes off a running
SSH job (exactly those on the host, whatever their index), and each refusal, with its reason, before
anything moves."""
import pytest

from paramshard.errors import ConfigError
from paramshard.launch.elastic.host_removal import plan_removal

# A job over three hosts: servers 0, 3 on a, 1, 2 on b, 4 on c; trainers 0, 2 on a, 1, 3 on b, 4 on c.
SERVERS = {0: "a", 1: "b", 2: "b", 3: "a", 4: "c"}
TRAINERS = {0: "a", 1: "b", 2: "a", 3: "b", 4: "c"}


def plan(host, servers=SERVERS, trainers=TRAINERS, partitions=256, min_trainers=1, max_trainers=5, moving=False):
    return plan_removal(host, servers, trainers, partitions=partitions, min_trainers=min_trainers,
                        max_trainers=max_trainers, moving=moving)


def test_the_hosts_own_servers_go_not_the_highest_and_its_trainers_leave():
    p = plan("b")
    assert (p.servers, p.servers_after, p.trainers, p.trainers_after) == ([1, 2], [0, 3, 4], [1, 3], 3)
    p = plan("c")
    assert (p.servers, p.servers_after, p.trainers, p.trainers_after) == ([4], [0, 1, 2, 3], [4], 4)


def test_a_host_running_nothing_or_only_servers_or_only_trainers():
    p = plan("d", servers={0: "a"}, trainers={0: "a"})
    assert (p.servers, p.trainers, p.servers_after, p.trainers_after) == ([], [], [0], 1)
    # Only trainers: the servers need no partitions; only servers: the trainers need not be elastic.
    p = plan("b", servers={0: "a"}, trainers={0: "a", 1: "b"}, partitions=0)
    assert (p.servers, p.trainers) == ([], [1])
    p = plan("b", servers={0: "a", 1: "b"}, trainers={0: "a"}, min_trainers=None)
    assert (p.servers, p.trainers) == ([1], [])


@pytest.mark.parametrize("host, kw, why", [
    ("a", {}, r"--remove-host a: it runs server 0, which holds the job's routing .* Remove another host, or "
              r"launch the job again with server 0 elsewhere \(it runs on the first host of --server-hosts"),
    ("a", {"servers": {0: "b", 1: "a"}}, r"it runs trainer 0, the chief .*Remove another host"),
    ("b", {"partitions": 0}, r"it runs servers \[1, 2\] and this job routes sparse ids by a fixed hash.*"
                             r"--partitions P"),
    ("b", {"min_trainers": None}, r"it runs trainers \[1, 3\] and this job is not elastic; launch it with "
                                  r"--trainers MIN:MAX"),
    ("b", {"min_trainers": 4}, r"its trainers \[1, 3\] leaving would leave 3, fewer than the job's minimum 4 "
                               r"\(--trainers 4:5\); start trainers on other hosts first"),
    ("b", {"servers": {0: "a", 1: "b"}, "trainers": {0: "a"}, "moving": True},
     r"a move of partitions is under way; ask again when it ended"),
    ("c", {"servers": {0: "a"}, "trainers": {0: "a", 1: "c"}, "moving": True}, r"a move of partitions is under way"),
])
def test_refusals_say_why(host, kw, why):
    with pytest.raises(ConfigError, match=why):
        plan(host, **kw)


def test_no_server_left_is_refused():
    # Not reachable with server 0 serving (it is never removed), but the plan does not rely on that.
    with pytest.raises(ConfigError, match=r"it runs every serving server \(\[1\]\); the job would have none left"):
        plan("b", servers={1: "b"}, trainers={0: "a"})


def test_a_job_not_launched_over_ssh_says_so():
    from paramshard.launch.supervision.launcher import Launcher
    with pytest.raises(ConfigError, match=r"--remove-host h: this job was not launched over SSH"):
        Launcher(engine=None)._remove_host("h")
