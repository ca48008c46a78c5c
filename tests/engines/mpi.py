"""OpenMPI (mpirun) and mpi4py for testing an MPI launch engine, locally or over SshHosts.

    require_mpi()                                            # skip (or fail) unless usable
    subprocess.run(mpirun_argv(4, sys.executable, "train.py"), check=True)
    with SshHosts() as hosts:                                # 127.0.0.2 and 127.0.0.3
        subprocess.run(mpirun_argv(4, sys.executable, "train.py", hosts=hosts,
                                   extra_env=["PYTHONPATH", "PARAMSHARD_X=1"]), check=True)

:func:`mpirun_argv` builds the command line: ``--allow-run-as-root`` as root,
``--oversubscribe --bind-to none`` (2 cores, 4+ ranks), ``--mca btl tcp,self --mca
btl_tcp_if_include lo --mca oob_tcp_if_include lo`` (TCP over loopback only, no shared
memory), ``-x NAME`` / ``-x NAME=value`` for the variables to pass on, and for several hosts a
hostfile (``127.0.0.2 slots=2`` ...) next to the ssh config, ``--mca plm_rsh_agent "ssh -F
CONFIG"`` and ``--mca plm_rsh_no_tree_spawn 1`` (mpirun itself starts every remote ``orted``
over ssh). A PyPI mpi4py wheel (4.1.2) uses Debian's Open MPI 4.1.4 (libmpi.so.40) at run
time; :func:`mpirun_problem` checks that both are there.

What a rank sees (Open MPI 4.1.4, Debian 12). Ranks of a *local* ``mpirun -np 2`` are forked by
mpirun and inherit its whole environment; ranks on a host reached over ssh are forked by that
host's ``orted`` and get the environment of orted's ssh session (sshd's default PATH, HOME,
SSH_*), not the caller's: pass what they need with ``-x``. Both get:

(a) rank and size::

    OMPI_COMM_WORLD_RANK=1  OMPI_COMM_WORLD_SIZE=4  (also PMIX_RANK=1, OMPI_MCA_ess_base_vpid=1)
    OMPI_COMM_WORLD_LOCAL_RANK=1  OMPI_COMM_WORLD_LOCAL_SIZE=2  (ranks on the same host)
    OMPI_COMM_WORLD_NODE_RANK=1 (= OMPI_MCA_orte_ess_node_rank)  OMPI_UNIVERSE_SIZE=4
    OMPI_MCA_orte_num_nodes=2   OMPI_MCA_orte_ess_num_procs=4

(b) the host: nothing Open MPI sets names the host as written in the hostfile.
``PMIX_HOSTNAME`` and ``MPI.Get_processor_name()`` are gethostname() (``vm`` for every
loopback host); ``OMPI_MCA_orte_hnp_uri=1299447808.0;tcp://127.0.0.1:54769`` is mpirun's
address and ``OMPI_MCA_orte_local_daemon_uri=1299447808.1;tcp://127.0.0.1:58837`` the local
orted's (the ``.1`` is the daemon's vpid: 0 = mpirun's own host, 1.. = the hosts in hostfile
order; the address is the OOB interface's, 127.0.0.1 for every host). The host's address
comes from ssh: the rank inherits orted's ``SSH_CONNECTION`` = ``client_ip client_port
server_ip server_port``, whose third field is the address it was reached at::

    ranks 0, 1 (127.0.0.2): SSH_CONNECTION=127.0.0.1 37132 127.0.0.2 56171  SSH_CLIENT=127.0.0.1 37132 56171
    ranks 2, 3 (127.0.0.3): SSH_CONNECTION=127.0.0.1 48022 127.0.0.3 34091

(ranks fill hosts slot by slot: with ``slots=2`` ranks 0-1 on the first host, 2-3 on the
second). Ranks of a local mpirun have no SSH_CONNECTION of their own: they inherit mpirun's
(absent here; if mpirun itself runs in an ssh session, that session's, which then names the
host mpirun runs on). Alternative that needs no ssh: one app context per host, each with its
own variable (tested)::

    mpirun ... -np 2 --host 127.0.0.2:2 -x HOSTADDR=127.0.0.2 CMD : -np 2 --host 127.0.0.3:2 -x HOSTADDR=127.0.0.3 CMD

Also set: OMPI_MCA_initial_wdir (the ranks' cwd, mpirun's cwd), OMPI_COMMAND/OMPI_ARGV, PMIX_ID,
PMIX_NAMESPACE, PMIX_SERVER_URI*, OMPI_FILE_LOCATION, OMPI_MCA_orte_jobfam_session_dir (under
/tmp/ompi.<hostname>.<uid>), and every ``--mca`` given to mpirun as ``OMPI_MCA_<name>``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pytest

from tests.engines import unavailable

INSTALL_HINT = ("install Open MPI with `sudo scripts/install-test-engines.sh` (package openmpi-bin) and mpi4py "
                "into the venv (`pip install -e \".[test]\"` or `pip install 'mpi4py>=4'`)")
LOOPBACK_MCA = ("--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo")


def _unavailable(reason: str) -> None:
    unavailable(reason, INSTALL_HINT)


_checked: list[str | None] = []

_PROBE = ("import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
          "print(MPI.Get_library_version().splitlines()[0])")


def mpirun_problem() -> str | None:
    """Why OpenMPI/mpi4py cannot run here (naming the package and the installer), or None."""
    if _checked:
        return _checked[0]
    problem = None
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        problem = "mpirun is missing (Debian package openmpi-bin)"
    else:
        try:
            r = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30,
                               stdin=subprocess.DEVNULL)
            if "Open MPI" not in r.stdout + r.stderr:
                problem = f"{mpirun} is not Open MPI's mpirun (openmpi-bin): {(r.stdout + r.stderr).strip()[:200]}"
        except (OSError, subprocess.SubprocessError) as exc:
            problem = f"`mpirun --version` failed: {exc}"
    if problem is None:
        try:
            r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60,
                               stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as exc:
            r, problem = None, f"probing mpi4py failed: {exc}"
        if r is not None and r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
            if "No module named 'mpi4py'" in r.stderr:
                problem = f"mpi4py is not installed in {sys.executable}"
            else:
                problem = f"mpi4py cannot load the MPI library (libmpi.so.40 from libopenmpi3/openmpi-bin): {last}"
        elif r is not None and "Open MPI" not in r.stdout:
            problem = f"mpi4py uses {r.stdout.strip()!r}, not Open MPI (openmpi-bin)"
    _checked.append(problem)
    return problem


def require_mpi() -> None:
    """Skip the calling test unless mpirun (Open MPI) and mpi4py work; fail instead with
    ``PARAMSHARD_REQUIRE_ENGINES=1``. The message says why and how to install."""
    problem = mpirun_problem()
    if problem:
        _unavailable(problem)


def _env_args(extra_env) -> list[str]:
    if isinstance(extra_env, Mapping):
        items = [f"{k}={v}" for k, v in extra_env.items()]
    else:
        items = [str(e) for e in extra_env]
    args: list[str] = []
    for item in items:
        args += ["-x", item]  # NAME: pass the caller's value on; NAME=value: set it
    return args


def write_hostfile(hosts: Sequence[str], slots: int, directory: str | os.PathLike) -> str:
    """A hostfile ``ADDRESS slots=N`` per host in ``directory`` (named after its content)."""
    text = "".join(f"{h} slots={slots}\n" for h in hosts)
    path = Path(directory) / f"mpi_hostfile_{hashlib.sha1(text.encode()).hexdigest()[:10]}"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return str(path)


def mpirun_argv(np: int, *command: str, hosts=None, ssh_config: str | os.PathLike | None = None,
                extra_env: Iterable[str] | Mapping[str, str] = (), slots: int = 2,
                extra: Iterable[str] = ()) -> list[str]:
    """The argv of ``mpirun`` running ``command`` as ``np`` ranks.

    Args:
        hosts: None (all ranks on this host, forked by mpirun), a list of addresses/names
            (written to a hostfile with ``slots`` slots each; reached with ``ssh -F ssh_config``
            or, without ssh_config, plain ssh), or a :class:`tests.engines.sshd.SshHosts`
            (its addresses and its ssh config).
        extra_env: variables for the ranks: ``"NAME"`` passes the caller's value, ``"NAME=value"``
            sets one; or a mapping. Remote ranks see only these, plus orted's ssh session env.
        extra: more mpirun options, placed before the command (e.g. ``["--tag-output"]``).
    """
    argv = [shutil.which("mpirun") or "mpirun"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    argv += ["--oversubscribe", "--bind-to", "none", "-np", str(np), *LOOPBACK_MCA]
    if hosts is not None:
        if hasattr(hosts, "ssh_config") and hasattr(hosts, "addresses"):  # an SshHosts
            ssh_config = ssh_config or hosts.ssh_config
            hosts = hosts.addresses
        hosts = list(hosts)
        directory = Path(ssh_config).parent if ssh_config else Path(tempfile.gettempdir())
        argv += ["--hostfile", write_hostfile(hosts, slots, directory)]
        ssh = shutil.which("ssh") or "ssh"
        agent = f"{ssh} -F {ssh_config}" if ssh_config else ssh
        argv += ["--mca", "plm_rsh_agent", agent, "--mca", "plm_rsh_no_tree_spawn", "1"]
    argv += _env_args(extra_env)
    argv += list(extra)
    argv += list(command)
    return argv


# -- pytest fixture (import it into a test module: `from tests.engines.mpi import mpi`) --

@pytest.fixture
def mpi():
    """Skip (or fail with PARAMSHARD_REQUIRE_ENGINES=1) unless Open MPI and mpi4py work;
    gives :func:`mpirun_argv`."""
    require_mpi()
    return mpirun_argv
