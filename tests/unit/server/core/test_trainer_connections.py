"""server/core/trainer_connections.py: a closed connection names its trainer once; a message still
queued from a closed connection does not tie it again; a reused descriptor is a new connection."""
import zmq

from paramshard.server.core.trainer_connections import TrainerConnections, peer_address


def test_a_disconnect_names_the_trainer_of_that_connection_once():
    c = TrainerConnections()
    assert c.tie(7, trainer=1) and c.tie(8, trainer=2)
    assert c.event(zmq.EVENT_DISCONNECTED, 7) == 1
    assert c.event(zmq.EVENT_DISCONNECTED, 7) is None
    assert c.event(zmq.EVENT_DISCONNECTED, 9) is None        # a connection no trainer used


def test_a_late_message_of_a_closed_connection_ties_nothing_until_the_fd_is_reused():
    c = TrainerConnections()
    c.tie(5, trainer=0)
    c.event(zmq.EVENT_DISCONNECTED, 5)
    assert not c.tie(5, trainer=0)                           # overtaken by its disconnect event
    c.event(zmq.EVENT_ACCEPTED, 5)                           # the descriptor belongs to a new connection
    assert c.tie(5, trainer=0) and c.event(zmq.EVENT_DISCONNECTED, 5) == 0


def test_peer_address_of_something_without_one_is_none():
    assert peer_address(object()) is None
