"""The engines' own variables `paramshard run` reads (launch/rank/world.py, launch/rank/rendezvous.py):
not settings of paramshard's, listed in docs/environment.md all the same."""
from __future__ import annotations

# What `paramshard run` reads from each engine (launch/rank/world.py, launch/rank/rendezvous.py):
# (engine, variable, what paramshard takes from it).
ENGINE_VARIABLES: tuple[tuple[str, str, str], ...] = (
    ("openmpi", "OMPI_COMM_WORLD_RANK", "rank"),
    ("openmpi", "OMPI_COMM_WORLD_SIZE", "world size"),
    ("openmpi", "OMPI_MCA_orte_hnp_uri", "mpirun's address: a server's own address is the one "
                                        "that routes towards it"),
    ("openmpi", "(MPI_Allgather)", "server addresses and every rank's host, exchanged over MPI"),
    ("slurm", "SLURM_PROCID", "rank"),
    ("slurm", "SLURM_NTASKS", "world size"),
    ("slurm", "SLURM_JOB_NODELIST", "first node (expanded with `scontrol show hostnames`): hosts "
                                    "the address store"),
    ("slurm", "SLURM_JOB_ID, SLURM_STEP_ID", "job id (keys, store namespace)"),
    ("slurm", "SLURMD_NODENAME", "this rank's host, in messages"),
    ("torchrun", "RANK", "rank"),
    ("torchrun", "WORLD_SIZE", "world size"),
    ("torchrun", "MASTER_ADDR, MASTER_PORT", "torchrun's own c10d store: the address exchange"),
    ("torchrun", "TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT", "job id and store namespace "
                                                                     "(a restart is a new job)"),
    ("any", "SSH_CONNECTION", "when a rank was started over ssh: the address its host was "
                              "reached at, which a server advertises"),
)
