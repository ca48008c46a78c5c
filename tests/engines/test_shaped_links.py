"""The shaped links of tests/engines/shaped.py do what benchmarks rely on: a host's rate holds
each way (its own tbf for what it sends, its bridge port's for what it receives) and the
link counters see every byte sent. An engine check, not a timing assertion of paramshard:
the band is wide (0.6x-1.6x of bytes / rate)."""
from tests.engines.shaped import shaped_lab  # noqa: F401  (the fixture)

RATE = 100e6          # bits/s
PAYLOAD = 4_000_000   # bytes: 0.32 s at RATE


def test_a_host_shaped_to_100_mbit_gets_that_rate_each_way_and_its_counters_see_every_byte(shaped_lab):
    lab = shaped_lab(3, subnet="10.213.32.0/24")
    lab.shape("100mbit", hosts=[0])              # hosts 1 and 2 stay unshaped
    expected = PAYLOAD * 8 / RATE
    sent = lab.transfer(0, 1, PAYLOAD)           # host 0's egress
    received = lab.transfer(2, 0, PAYLOAD)       # host 0's ingress
    free = lab.transfer(1, 2, PAYLOAD)           # no limit on this path
    for what, r in (("sent by host 0", sent), ("received by host 0", received)):
        assert r["bytes"] == PAYLOAD, what
        assert 0.6 * expected <= r["seconds"] <= 1.6 * expected, (what, r, expected)
        # Bytes on the wire: the payload plus headers and ACKs' share, nothing lost or doubled.
        assert PAYLOAD <= r["src_tx_bytes"] <= 1.05 * PAYLOAD, (what, r)
        assert PAYLOAD <= r["dst_rx_bytes"] <= 1.05 * PAYLOAD, (what, r)
    assert free["seconds"] < 0.6 * expected, ("the unshaped path is limited too", free)
