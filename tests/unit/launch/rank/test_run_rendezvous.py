"""`paramshard run`'s pieces: engine detection, own address, the store exchange."""
import threading

import pytest

from paramshard.env import ENGINE_VARIABLES, engine_variables_markdown, variables_markdown
from paramshard.errors import ConfigError
from paramshard.launch.engines.ports import free_ports
from paramshard.launch.rank.rendezvous import RendezvousError, StoreExchange, own_address, slurm_store_port
from paramshard.launch.rank.world import World, _hnp_host, detect

OMPI = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_MCA_orte_hnp_uri": "4097114112.0;tcp://10.1.2.3,127.0.0.1:45321"}
TORCHRUN = {"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500",
            "TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "2"}
SLURM = {"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0",
         "SLURMD_NODENAME": "node7", "SLURM_JOB_NODELIST": "node[7-8]"}


def test_each_engine_is_detected_with_its_rank_and_size():
    mpi = detect(OMPI)
    assert (mpi.engine, mpi.rank, mpi.size, mpi.rendezvous_host) == ("openmpi", 3, 4, "10.1.2.3")
    torch = detect(TORCHRUN)
    assert (torch.engine, torch.rank, torch.size, torch.rendezvous_host) == ("torchrun", 1, 4, "localhost")
    assert torch.job_key == "torchrun-abc-r2"         # a restart is a new job: new keys, new store prefix
    slurm = detect(SLURM)
    assert (slurm.engine, slurm.rank, slurm.size, slurm.node, slurm.job_key) == ("slurm", 2, 4, "node7",
                                                                                "slurm-77.0")
    assert detect({"PATH": "/bin"}) is None


def test_the_innermost_launcher_wins():
    # mpirun inside a Slurm allocation; torchrun started by srun on each node.
    assert detect({**SLURM, **OMPI}).engine == "openmpi"
    assert detect({**SLURM, **TORCHRUN}).engine == "torchrun"


def test_bad_engine_values_are_named():
    with pytest.raises(ConfigError, match="OMPI_COMM_WORLD_SIZE='four'"):
        detect({**OMPI, "OMPI_COMM_WORLD_SIZE": "four"})
    with pytest.raises(ConfigError, match="rank 4 is outside the world of size 4"):
        detect({**TORCHRUN, "RANK": "4"})


def test_hnp_uri_gives_mpiruns_first_address():
    assert _hnp_host("1.0;tcp://192.168.1.5,10.0.0.1:1234") == "192.168.1.5"
    assert _hnp_host("1.0;tcp://127.0.0.1:1234;tcp6://[::1]:1235") == "127.0.0.1"
    assert _hnp_host("") is None


def test_own_address_prefers_the_explicit_host_then_the_route():
    world = World("torchrun", 0, 2, "vm", rendezvous_host="127.0.0.1")
    assert own_address(world, {"PARAMSHARD_HOST": "10.9.9.9"}) == "10.9.9.9"
    assert own_address(world, {}) == "127.0.0.1"
    # On loopback, an ssh login to a loopback alias says which simulated host this is ...
    assert own_address(world, {"SSH_CONNECTION": "127.0.0.1 50000 127.0.0.3 22"}) == "127.0.0.3"
    # ... but a login from elsewhere says nothing about the route between the ranks.
    assert own_address(world, {"SSH_CONNECTION": "192.0.2.1 50000 198.51.100.7 22"}) == "127.0.0.1"


def test_slurm_store_port_flag_then_variable_then_job_id():
    assert slurm_store_port({"SLURM_JOB_ID": "77"}, 5000) == 5000
    assert slurm_store_port({"SLURM_JOB_ID": "77", "PARAMSHARD_STORE_PORT": "6000"}, None) == 6000
    assert slurm_store_port({"SLURM_JOB_ID": "77"}, None) == 29600 + 77
    with pytest.raises(ConfigError, match="PARAMSHARD_STORE_PORT='x'"):
        slurm_store_port({"PARAMSHARD_STORE_PORT": "x"}, None)


def _exchange_in_threads(size, port, records, timeout=10.0, skip=()):
    results, errors = [None] * size, [None] * size

    def rank(r):
        world = World("slurm", r, size, f"node{r}", job_key="t", rendezvous_host="127.0.0.1")
        try:
            ex = StoreExchange(world, "127.0.0.1", port, timeout, hosting=(r == 0))
            try:
                results[r] = ex.allgather(records[r])
            finally:
                ex.close()
        except Exception as exc:   # noqa: BLE001 - inspected by the test
            errors[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size) if r not in skip]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout * 3)
    return results, errors


def test_store_exchange_gives_every_rank_every_record_in_rank_order():
    port = free_ports(1)[0]
    records = [{"rank": r, "server": f"127.0.0.1:{1000 + r}" if r < 2 else None} for r in range(4)]
    results, errors = _exchange_in_threads(4, port, records)
    assert errors == [None] * 4
    assert results == [records] * 4


@pytest.mark.slow_unit(reason="waits out the rendezvous deadline for the rank that never reports")
def test_a_rank_that_never_reports_is_named_within_the_deadline():
    port = free_ports(1)[0]
    records = [{"rank": r} for r in range(3)]
    results, errors = _exchange_in_threads(3, port, records, timeout=2.0, skip=(2,))
    assert isinstance(errors[1], RendezvousError)
    assert "ranks [2] did not report" in str(errors[1])


def test_engine_table_names_every_engine_and_is_in_the_docs():
    from pathlib import Path
    engines = {engine for engine, _, _ in ENGINE_VARIABLES}
    assert {"openmpi", "slurm", "torchrun"} <= engines
    docs = Path(__file__).parents[4] / "docs"
    for page in ("environment.md", "engines.md"):
        assert engine_variables_markdown() in (docs / page).read_text(), \
            f"docs/{page}'s engine table is stale: paramshard env --markdown"


def test_the_docs_contract_table_is_the_generated_one_and_the_readme_links_it():
    from pathlib import Path
    root = Path(__file__).parents[4]
    assert "docs/environment.md" in (root / "README.md").read_text()
    docs = (root / "docs" / "environment.md").read_text()
    assert variables_markdown() in docs, "docs/environment.md is stale: paramshard env --markdown"
