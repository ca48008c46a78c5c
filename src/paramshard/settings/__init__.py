"""Every setting declared once (table.py), and what is generated from the table: the
environment contract (fields.py, used by ``ClusterEnv``), ``LaunchConfig``'s fields and its
copy into each rank's contract, the commands' flags (flags.py) and docs/environment.md (docs.py)."""
from paramshard.settings.setting import JOB, K8S, LAUNCH, Flag, Setting, flag

__all__ = ["JOB", "K8S", "LAUNCH", "Flag", "Setting", "flag"]
