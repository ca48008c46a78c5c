"""A fake JobControl (launch/elastic/job_control.py): the whole port an elastic controller may use,
recording what the controller did to the job. No process, no engine, no Launcher."""
import dataclasses

from paramshard.env import ClusterEnv
from paramshard.launch.api import JobSpec, RankSpec
from paramshard.launch.supervision.restart_policy import RestartPolicy


class FakeRank:
    """A process: running (None) or ended with ``code``."""

    def __init__(self, tag, code=None):
        self.tag, self.code = tag, code

    def poll(self):
        return self.code

    def describe_exit(self):
        return f"{self.tag} exited with code {self.code}"

    def __repr__(self):
        return f"FakeRank({self.tag!r}, {self.code})"


class FakeJob:
    """A running job of ``servers`` servers and ``trainers`` trainer slots, as a controller sees it."""

    def __init__(self, servers=2, trainers=0, partitions=256, recovery="rollback", can_start=True,
                 checkpoint_dir=None, restarts=0):
        env = ClusterEnv(role=None, servers=tuple(f"127.0.0.1:{i + 1}" for i in range(servers)),
                         partitions=partitions, recovery=recovery, mode="async", checkpoint_dir=checkpoint_dir,
                         num_trainers=max(trainers, 1))
        self._spec = JobSpec(
            tuple(RankSpec(f"server {i}", dataclasses.replace(env, role="server", server_id=i), ("python",))
                  for i in range(servers)),
            tuple(RankSpec(f"trainer {i}", dataclasses.replace(env, role="trainer", trainer_id=i), ("python",))
                  for i in range(trainers)))
        self._servers = [FakeRank(r.name) for r in self._spec.servers]
        self._trainers = [FakeRank(r.name) for r in self._spec.trainers]
        self._policy = RestartPolicy(restarts)
        self.can_start = can_start
        self.ports = iter(range(servers + 1, 100))
        self.started: list[RankSpec] = []          # every rank started mid-job, in order
        self.asked: list[int] = []                 # trainer slots asked to leave
        self.asked_hosts: list = []                # the host each new server's address was asked for
        self.events: list = []                     # ((event, text), fields)
        self.told: list = []                       # ((change, text), fields)
        self.ended = False

    # -- JobControl ---------------------------------------------------------------
    @property
    def spec(self):
        return self._spec

    @property
    def servers(self):
        return list(self._servers)

    @property
    def trainers(self):
        return list(self._trainers)

    @property
    def policy(self):
        return self._policy

    @property
    def starts_servers(self):
        return self.can_start

    def new_server_address(self, host=None):
        self.asked_hosts.append(host)
        return f"{host or '127.0.0.1'}:{next(self.ports)}"

    def start_server(self, rank):
        self.started.append(rank)
        p = FakeRank(rank.name)
        self._servers.append(p)
        return p

    def start_trainer(self, slot, rank):
        self.started.append(rank)
        p = FakeRank(rank.name)
        self._trainers[slot] = p
        return p

    def ask_to_leave(self, slot):
        self.asked.append(slot)

    def job_ended(self):
        return self.ended

    def record(self, event, text, **fields):
        self.events.append(((event, text), fields))

    def tell_membership(self, change, text, **fields):
        self.told.append(((change, text), fields))
