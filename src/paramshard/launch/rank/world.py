"""Which engine started this process, and where it stands in that engine's world.

``paramshard run`` is started by mpirun, srun, torchrun (or by hand) on every
rank. Each engine says the rank and world size its own way; ``detect`` reads
them into one ``World``. Order matters: mpirun inside a Slurm allocation also
leaves the allocation's SLURM_* variables, and torchrun under srun sees both
RANK and SLURM_PROCID; the innermost launcher is the one that counts.

Every variable read here is declared in ``paramshard.env.ENGINE_VARIABLES``
(docs/engines.md's engine table is generated from it).
"""
from __future__ import annotations

import dataclasses
import socket
from typing import Mapping

from paramshard.errors import ConfigError



@dataclasses.dataclass(frozen=True)
class World:
    engine: str                  # "openmpi", "slurm", "torchrun"
    rank: int
    size: int
    node: str                    # the engine's name for this rank's host (messages only)
    job_key: str = ""            # the same on every rank of one run, new for the next (restarts too)
    rendezvous_host: str | None = None   # a host every rank reaches: the route towards it picks our address

    def __post_init__(self):
        if not 0 <= self.rank < self.size:
            raise ConfigError(f"{self.engine}: rank {self.rank} is outside the world of size {self.size}")

    def describe(self) -> str:
        return f"rank {self.rank} of {self.size} on {self.node} ({self.engine})"


def _int(e: Mapping[str, str], name: str) -> int:
    value = e.get(name, "")
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not a whole number") from None


def _hnp_host(uri: str) -> str | None:
    """mpirun's address from OMPI_MCA_orte_hnp_uri ('123.0;tcp://10.0.0.1,127.0.0.1:4567')."""
    _, _, contacts = uri.partition(";")
    for contact in contacts.split(";"):
        if contact.startswith("tcp://"):
            return contact[len("tcp://"):].rpartition(":")[0].split(",")[0] or None
    return None


def detect(environ: Mapping[str, str]) -> World | None:
    """The engine's world, or None when no engine variables are set."""
    e = environ
    node = socket.gethostname()
    if e.get("OMPI_COMM_WORLD_RANK"):
        return World("openmpi", _int(e, "OMPI_COMM_WORLD_RANK"), _int(e, "OMPI_COMM_WORLD_SIZE"),
                     node=node, rendezvous_host=_hnp_host(e.get("OMPI_MCA_orte_hnp_uri", "")))
    if e.get("RANK") and e.get("WORLD_SIZE") and e.get("MASTER_ADDR"):
        run_id = e.get("TORCHELASTIC_RUN_ID", "none")
        restart = e.get("TORCHELASTIC_RESTART_COUNT", "0")
        return World("torchrun", _int(e, "RANK"), _int(e, "WORLD_SIZE"), node=node,
                     job_key=f"torchrun-{run_id}-r{restart}", rendezvous_host=e["MASTER_ADDR"])
    if e.get("SLURM_PROCID") and e.get("SLURM_NTASKS"):
        job = e.get("SLURM_JOB_ID", "0")
        step = e.get("SLURM_STEP_ID", "0")
        return World("slurm", _int(e, "SLURM_PROCID"), _int(e, "SLURM_NTASKS"),
                     node=e.get("SLURMD_NODENAME") or node, job_key=f"slurm-{job}.{step}")
    return None
