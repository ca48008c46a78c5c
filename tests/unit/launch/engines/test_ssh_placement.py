"""launch/engines/ssh_placement.py with a fake probe and copy: which host a rank started mid-job goes to
(the start-up rule: fewest live ranks, first on a tie, slots respected, the role's hosts), the port
a new server gets from its own host, and a host added to the job (checked, probed, copied to once
per machine, then the emptiest choice)."""
import dataclasses

import pytest

from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError
from paramshard.launch.api import RankSpec
from paramshard.launch.engines.hosts import Host, parse_hosts
from paramshard.launch.engines.ssh import Probed


class Fakes:
    def __init__(self, live, machine_of=None):
        self.live = live                      # ssh targets of the live ranks
        self.probed, self.copied, self.events = [], [], []
        self.machine_of = machine_of or {}
        self.port = 40000

    def probe(self, host, ports):
        self.probed.append((host.target, ports))
        self.port += 1
        return Probed(self.machine_of.get(host.host, "m-" + host.host), 4, list(range(self.port, self.port + ports)))

    def dispatch(self, host):
        self.copied.append(host.target)
        return 3


def make(live, hosts="10.0.0.1,10.0.0.2", server_hosts=None, trainer_hosts=None, dispatch=True, **kw):
    from paramshard.launch.engines.ssh_placement import SshPlacement
    fakes = Fakes(live, **kw)
    hosts, s, t = (parse_hosts(x) if x else None for x in (hosts, server_hosts, trainer_hosts))
    engine_hosts = {h.host: h for h in [*hosts, *(s or []), *(t or [])]}
    placement = SshPlacement(hosts, s, t, engine_hosts=engine_hosts, machines={"m-10.0.0.1", "m-10.0.0.2"},
                             live_hosts=lambda: fakes.live, probe=fakes.probe,
                             dispatch=fakes.dispatch if dispatch else None,
                             record=lambda *a, **f: fakes.events.append((a, f)))
    return placement, fakes


def server_rank(index, address):
    env = ClusterEnv(role="server", server_id=index, servers=("10.0.0.1:1", "10.0.0.2:2", address),
                     host="10.0.0.1")
    return RankSpec(f"server {index}", env, ("python",), "10.0.0.1")


def trainer_rank(slot):
    env = ClusterEnv(role="trainer", trainer_id=slot, num_trainers=4, servers=("10.0.0.1:1",), host="10.0.0.1")
    return RankSpec(f"trainer {slot}", env, ("python", "train.py"), "10.0.0.1")


def test_a_new_rank_goes_to_the_host_with_the_fewest_live_ranks_first_on_a_tie():
    placement, _ = make(["10.0.0.1", "10.0.0.1", "10.0.0.2"])
    assert placement.pick("trainer").host == "10.0.0.2"
    placement, _ = make(["10.0.0.1", "10.0.0.2"])
    assert placement.pick("trainer").host == "10.0.0.1"
    # slots=N is respected, as at start-up; a full job says what to do.
    placement, _ = make(["10.0.0.1", "10.0.0.2"], hosts="10.0.0.1 slots=1,10.0.0.2")
    assert placement.pick("server").host == "10.0.0.2"
    placement, _ = make(["10.0.0.1", "10.0.0.2"], hosts="10.0.0.1 slots=1,10.0.0.2 slots=1")
    with pytest.raises(ConfigError, match="no free slot for a new trainer.*add hosts or raise slots=N"):
        placement.pick("trainer")


def test_each_role_stays_on_its_own_hosts():
    placement, _ = make(["10.0.0.1", "10.0.0.2"], hosts="10.0.0.1,10.0.0.2", server_hosts="10.0.0.5",
                        trainer_hosts="10.0.0.6")
    assert placement.pick("server").host == "10.0.0.5" and placement.pick("trainer").host == "10.0.0.6"


def test_a_new_server_gets_a_port_from_its_own_host_and_starts_there():
    placement, fakes = make(["10.0.0.1", "10.0.0.1", "10.0.0.2"])
    address = placement.new_server_address()
    assert address == "10.0.0.2:40001" and fakes.probed == [("10.0.0.2", 1)]
    rank = placement.place_rank(server_rank(2, address))
    assert (rank.host, rank.env.host, rank.env.servers[2]) == ("10.0.0.2", "10.0.0.2", address)
    assert placement.server_host == {}         # asked once, placed once


def test_a_joining_trainer_is_placed_and_told_its_hosts_address():
    placement, _ = make(["10.0.0.1", "10.0.0.1", "10.0.0.2"])
    rank = placement.place_rank(trainer_rank(3))
    assert (rank.host, rank.env.host, rank.env.trainer_id, rank.argv) == ("10.0.0.2", "10.0.0.2", 3,
                                                                          ("python", "train.py"))


def test_an_added_host_is_probed_copied_to_and_then_takes_the_next_ranks():
    placement, fakes = make(["10.0.0.1", "10.0.0.2"])
    reply = placement.add_host("10.0.0.3")
    assert "host 10.0.0.3 added" in reply and "workspace copied" in reply
    assert fakes.probed == [("10.0.0.3", 0)] and fakes.copied == ["10.0.0.3"]
    assert placement.engine_hosts["10.0.0.3"] == Host("10.0.0.3")
    assert [(a[0], f["host"], f["files_sent"]) for a, f in fakes.events] == [("host_added", "10.0.0.3", 3)]
    assert placement.pick("trainer").host == "10.0.0.3" and placement.pick("server").host == "10.0.0.3"
    fakes.live.append("10.0.0.3")
    fakes.live.append("10.0.0.3")
    assert placement.pick("trainer").host == "10.0.0.1"      # loads 1, 1, 2: the first again
    # Under --server-hosts / --trainer-hosts an added host serves both roles.
    placement, fakes = make([], server_hosts="10.0.0.5", trainer_hosts="10.0.0.6")
    placement.add_host("u@10.0.0.7:2222")
    fakes.live[:] = ["10.0.0.5", "10.0.0.6"]
    assert placement.pick("server").target == "u@10.0.0.7" and placement.pick("trainer").port == 2222


def test_a_host_on_a_machine_with_the_workspace_or_a_job_without_one_is_not_copied_to():
    placement, fakes = make([], machine_of={"10.0.0.3": "m-10.0.0.1"})
    assert "already there (same machine)" in placement.add_host("10.0.0.3") and fakes.copied == []
    placement, fakes = make([], dispatch=False)
    assert "no workspace to copy" in placement.add_host("10.0.0.4") and fakes.copied == []


def test_bad_or_known_hosts_are_refused_before_anything_runs():
    placement, fakes = make([])
    with pytest.raises(ConfigError, match="10.0.0.2 is one of this job's hosts already"):
        placement.add_host("10.0.0.2")
    with pytest.raises(ConfigError, match="starts with '-'"):
        placement.add_host("-oProxyCommand=touch")
    with pytest.raises(ConfigError, match="not slots=N"):
        placement.add_host("10.0.0.9 slots=0")
    assert fakes.probed == [] and placement.added == []


def test_a_host_whose_probe_fails_is_not_added():
    placement, fakes = make([])

    def refuse(host, ports):
        raise ConfigError(f"ssh to {host.target} failed (exit 255): Connection refused")
    placement.probe = refuse
    with pytest.raises(ConfigError, match="Connection refused"):
        placement.add_host("10.0.0.3")
    assert "10.0.0.3" not in placement.engine_hosts and placement.added == [] and fakes.events == []


def test_a_new_server_goes_to_the_host_a_request_names_if_the_job_may_use_it():
    placement, fakes = make(["10.0.0.2"], hosts="10.0.0.1 slots=1,10.0.0.2", server_hosts="10.0.0.1 slots=1,u@10.0.0.2")
    assert placement.new_server_address("10.0.0.2") == "10.0.0.2:40001"       # not the least loaded 10.0.0.1
    assert placement.new_server_address("u@10.0.0.2").startswith("10.0.0.2:")
    with pytest.raises(ConfigError, match="--on 10.0.0.9: not one of the hosts.*add it first: --add-host 10.0.0.9"):
        placement.new_server_address("10.0.0.9")
    fakes.live.append("10.0.0.1")
    with pytest.raises(ConfigError, match="no free slot for a new server on 10.0.0.1"):
        placement.new_server_address("10.0.0.1")
    placement.add_host("10.0.0.9")
    assert placement.new_server_address("10.0.0.9").startswith("10.0.0.9:")
    assert [p for p in fakes.probed if p[1] == 1] == [("u@10.0.0.2", 1)] * 2 + [("10.0.0.9", 1)]


def test_a_removed_host_is_never_placed_on_again_and_may_be_added_back():
    placement, fakes = make(["10.0.0.1", "10.0.0.1"], hosts="10.0.0.1,root@10.0.0.2")
    assert placement.find("10.0.0.2").target == "root@10.0.0.2"
    assert placement.find("root@10.0.0.2").host == "10.0.0.2"
    with pytest.raises(ConfigError, match=r"--remove-host other@10.0.0.2: not one of this job's hosts "
                                          r"\(10.0.0.1, root@10.0.0.2\)"):
        placement.find("other@10.0.0.2")
    assert placement.pick("trainer").host == "10.0.0.2"          # the least loaded, until removed
    placement.remove_host(placement.find("10.0.0.2"))
    assert placement.pick("trainer").host == "10.0.0.1" and placement.pick("server").host == "10.0.0.1"
    with pytest.raises(ConfigError, match="not one of the hosts this job may start a server on"):
        placement.new_server_address("10.0.0.2")
    with pytest.raises(ConfigError, match="10.0.0.2 was removed from this job already"):
        placement.find("10.0.0.2")
    assert "10.0.0.2" in placement.engine_hosts       # its ranks still running are stopped through it
    assert "added to the job" in placement.add_host("root@10.0.0.2")
    assert placement.pick("trainer").host == "10.0.0.2"
