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

