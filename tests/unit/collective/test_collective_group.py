"""The pieces of collective/group.py that need no second process."""
from paramshard.collective.group import explain, interface_of


def test_loopback_addresses_are_on_lo_and_unknown_ones_on_nothing():
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("127.0.0.3") == "lo"          # an alias: gloo binds lo's address
    assert interface_of("192.0.2.77") is None         # TEST-NET-1: held by no interface here
    assert interface_of("not-an-address") is None


def test_a_gloo_peer_failure_names_the_other_trainers():
    gone = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:24788. This is ...")
    two = explain(gone, trainer_id=0, num_trainers=2, step=5)
    assert "trainer 0: the allreduce of step 5 failed: trainer 1 stopped answering" in str(two)
    four = explain(gone, trainer_id=2, num_trainers=4, step=0)
    assert "one of trainers [0, 1, 3]" in str(four)
    assert explain(RuntimeError("mat1 and mat2 shapes cannot be multiplied"), 0, 2, 1) is None


def test_a_store_not_reachable_yet_is_retried_until_the_timeout():
    """On Kubernetes trainer 1 may start before trainer 0's store (or its DNS record) exists: it
    retries up to PARAMSHARD_TIMEOUT instead of dying of the first failed connection, then names
    the store. Nothing listens on the port here (no DNS lookup: the tests send nothing off loopback)."""
    import datetime
    import time
    import types

    import pytest

    from paramshard.collective.group import CollectiveError, _store
    from paramshard.launch.engines.ports import free_ports
    addr = f"127.0.0.1:{free_ports(1)[0]}"
    started = time.monotonic()
    with pytest.raises(CollectiveError) as caught:
        _store(types.SimpleNamespace(trainer_id=1, num_trainers=2), addr, datetime.timedelta(seconds=0.6))
    assert time.monotonic() - started >= 0.6                       # retried, not failed at once
    message = str(caught.value)
    assert f"trainer 1 could not reach the trainers' store at {addr} (hosted by trainer 0) within 0.6 s" in message
    assert "did trainer 0 start?" in message
