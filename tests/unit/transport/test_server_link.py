"""transport/server_link.py: what a link's monitor events make of its state (up, lost, refused),
told without a server: the events are fed as libzmq would report them."""
import zmq

from paramshard.transport import server_link
from paramshard.transport.server_link import REFUSALS_IN_A_ROW, RetiredLink, ServerLink


class FakeMonitor:
    def __init__(self, events):
        self.events, self.closed = list(events), False

    def poll(self, timeout):
        return len(self.events)


def link_with(monkeypatch, events, curve=True) -> ServerLink:
    """A ServerLink without sockets: its state as the constructor leaves it, and a monitor that
    holds ``events`` [(event, value)]."""
    link = ServerLink.__new__(ServerLink)
    link.curve = curve
    link.reached = link.connected = link.ever_connected = link.key_refused = link.given_up = False
    link.losses = link.failed_handshakes = 0
    link.refusal = None
    link.monitor = FakeMonitor(events)
    monkeypatch.setattr(server_link, "recv_monitor_message",
                        lambda monitor: dict(zip(("event", "value"), monitor.events.pop(0))))
    return link


def test_a_link_is_up_only_after_its_handshake(monkeypatch):
    link = link_with(monkeypatch, [(zmq.EVENT_CONNECTED, 0)])
    link.poll_events()
    assert link.reached and not link.connected          # a stopped process's kernel accepts TCP too
    link.monitor.events.append((zmq.EVENT_HANDSHAKE_SUCCEEDED, 0))
    link.poll_events()
    assert link.connected and link.ever_connected and link.losses == 0


def test_a_connection_lost_after_its_handshake_counts_once(monkeypatch):
    link = link_with(monkeypatch, [(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0), (zmq.EVENT_DISCONNECTED, 0),
                                   (zmq.EVENT_CLOSED, 0)])
    link.poll_events()
    assert not link.connected and link.ever_connected and link.losses == 1


def test_handshakes_closed_in_a_row_are_a_refusal_and_a_success_clears_it(monkeypatch):
    link = link_with(monkeypatch, [(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0)] * (REFUSALS_IN_A_ROW - 1))
    link.poll_events()
    assert link.refusal is None                          # a server still starting closes a few too
    link.monitor.events.append((zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0))
    link.poll_events()
    assert f"{REFUSALS_IN_A_ROW} times in a row" in link.refusal
    link.monitor.events.append((zmq.EVENT_HANDSHAKE_SUCCEEDED, 0))
    link.poll_events()
    assert link.refusal is None and link.failed_handshakes == 0


def test_refusals_say_which_side_has_which_setting(monkeypatch):
    mismatch = (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
    ours_curve = link_with(monkeypatch, [mismatch], curve=True)
    ours_curve.poll_events()
    assert "it speaks plain TCP and this process CurveZMQ" in ours_curve.refusal
    ours_plain = link_with(monkeypatch, [mismatch], curve=False)
    ours_plain.poll_events()
    assert "it requires CurveZMQ and this process has no secret" in ours_plain.refusal
    key = link_with(monkeypatch, [(zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400)])
    key.poll_events()
    assert key.key_refused and "ZAP status 400" in key.refusal


def test_a_retired_link_names_the_server_a_scale_removed():
    link = RetiredLink(2, "127.0.0.1:4000")
    assert link.retired and not link.connected and link.sock is None
    assert link.name == "server 2 (removed by a scale, was 127.0.0.1:4000)"
    assert RetiredLink(3).name == "server 3 (removed by a scale)"
    link.poll_events()
    link.close()
