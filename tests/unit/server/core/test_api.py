"""server/core/api.py: every service a server runs offers each member of the Service contract, and the
ops of all services are distinct (a server refuses an op served twice)."""
import pytest

from paramshard.server.core.api import Service
from paramshard.server.services.checkpoint_service import attach_checkpoints
from paramshard.server.core.parameter_server import ParameterServer
from paramshard.server.services.sparse_service import SparseService


def test_every_service_of_a_full_server_keeps_the_contract():
    server = ParameterServer(0, None, num_trainers=1, timeout=5.0)
    server.add_service(SparseService(server.context.mode, server.context.membership))
    attach_checkpoints(server)
    members = [name for name in vars(Service) if not name.startswith("_")]
    assert set(members) == {"ops", "hooks", "stats", "on_leave", "reset"}
    for service in server.services:
        assert [m for m in members if not callable(getattr(service, m, None))] == [], type(service).__name__
    assert server.context.services == server.services     # leave and reset reach every one
    kinds = [type(h).__name__ for h in server._hooks]
    assert kinds == ["EpochCheck", "PushGateHook", "DropGuard"]        # in the order their services were added
    with pytest.raises(ValueError, match="served twice"):
        server.add_service(SparseService(server.context.mode, server.context.membership))
