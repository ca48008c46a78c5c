"""server/assembly.py: one function builds a server, and SERVICES states the order its
services are added in, which is the order their request hooks run in (the core loop asks each
in turn). Oracle: the server as built, service by service and hook by hook."""
import pytest

from paramshard.env import ClusterEnv
from paramshard.server.assembly import BOUNDED_LOSS_SERVICES, DELTA_SERVICES, SERVICES, build_server

# Each service's hooks, in the order the service declares them.
HOOKS = {"ControlHandlers": ["EpochCheck"], "MigrationService": ["MigrationHook"],
         "DenseMigration": ["DenseMoveHook"], "CheckpointService": ["PushGateHook", "DropGuard"],
         "ReplicationService": ["ReplayGuard"], "DeltaService": ["DeltaHook"]}


@pytest.mark.parametrize("recovery, deltas, expected", [
    ("rollback", False, SERVICES),
    ("bounded-loss", False, SERVICES + BOUNDED_LOSS_SERVICES),
    ("bounded-loss", True, SERVICES + BOUNDED_LOSS_SERVICES + DELTA_SERVICES),
])
def test_the_server_runs_its_services_and_hooks_in_the_stated_order(recovery, deltas, expected, tmp_path):
    env = ClusterEnv(role=None, server_id=0, mode="async", recovery=recovery,
                     delta_dir=str(tmp_path) if deltas else None)
    server = build_server(env, num_trainers=1, watch_peers=False, in_process=True)
    try:
        assert tuple(type(s).__name__ for s in server._services) == expected
        assert [type(h).__name__ for h in server._hooks] == [h for s in expected for h in HOOKS.get(s, [])]
    finally:
        server.close()
