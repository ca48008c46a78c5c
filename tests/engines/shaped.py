"""Rate-limited links on a :class:`tests.engines.netns.NetnsLab`: each "host" gets R bit/s
each way, and the bytes it puts on the wire are counted.

    with ShapedLab(4, rate="100mbit") as lab:          # 4 hosts on one bridge, 100 Mbit/s each
        lab.transfer(0, 1, 5_000_000)                  # {'seconds': ~0.4, 'bits_per_s': ~1e8, ...}
        lab.shape("1gbit", hosts=[2, 3])               # change the rate of some hosts
        lab.counters()                                 # per host: tx/rx bytes and packets so far

How the rate is applied (token bucket filter, ``tc qdisc ... tbf rate R burst B latency L``):

- host I's egress: on ``eth0`` inside host I's namespace;
- host I's ingress: on the bridge port ``pI`` (the other end of host I's veth), whose egress
  is what host I receives. So a host's traffic is limited to R in each direction, as a NIC
  of R would limit it; the bridge itself is not a bottleneck (it has no limit of its own).

Burst B is ``max(128 KiB, 1 ms of R)``: at least one 64 KiB GSO packet with headers (a
smaller burst makes tbf split every packet in software) and enough for a 1 ms timer tick at
high rates. Latency L (the queue tbf keeps before dropping) is 50 ms of R by default.

NOT AVAILABLE: latency (and loss) injection. netem is not built into this kernel
(``tc qdisc add dev X root netem delay 10ms`` fails with "Specified qdisc kind is
unknown"; checked 2026-11-29, kernel 6.18), so the links here have the veth's own
microsecond latency and only their rate is realistic. :func:`netem_available` says whether
a kernel has it.

Counters: :meth:`ShapedLab.counters` reads the bridge ports' statistics in one ``ip -s -j
link`` call in the bridge namespace: port pI's rx bytes are what host I sent (after its tbf),
its tx bytes what host I received. They are bytes on the wire: Ethernet, IP and TCP headers
and every protocol's packets (ARP, ACKs, ssh) included. :class:`CounterSampler` samples
them on a thread so that a benchmark can take the bytes of a time window it learns later.

Safety is NetnsLab's: nothing is created in the root namespace but the ``unreachable``
route to the lab's subnet (for the lab's lifetime); :meth:`ShapedLab.transfer` starts both
ends inside the namespaces, bound to the hosts' lab addresses; processes are stopped by PID.
"""

from __future__ import annotations

import bisect
import json
import re
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterable

from tests.engines.netns import PREFIX, NetnsError, NetnsLab, _ip, lab_factory, require_netns

_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?bit)\s*$", re.IGNORECASE)


def parse_rate(rate: str | float) -> float:
    """``"100mbit"`` (tc's decimal units: bit, kbit, mbit, gbit, tbit) or a number -> bits/s."""
    if isinstance(rate, (int, float)):
        return float(rate)
    m = _RATE_RE.match(rate)
    if not m:
        raise ValueError(f"rate {rate!r}: give a number and one of {', '.join(_UNITS)} (e.g. 100mbit)")
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


def tbf_args(rate: str | float, latency: str = "50ms") -> list[str]:
    bits = parse_rate(rate)
    burst = max(128 * 1024, int(bits / 8 / 1000))
    return ["tbf", "rate", f"{int(bits)}bit", "burst", str(burst), "latency", latency]


_probe: dict[str, str] = {}


def _probe_qdiscs() -> dict[str, str]:
    """Try tbf and netem on a veth in a throwaway namespace; qdisc kind -> '' (works) or the error."""
    if not _probe:
        ns = f"{PREFIX}probe-{secrets.token_hex(4)}"
        _ip("netns", "add", ns)
        try:
            _ip("link", "add", "pa", "type", "veth", "peer", "name", "pb", ns=ns)
            for kind, args in (("tbf", tbf_args("100mbit")), ("netem", ["netem", "delay", "10ms"])):
                r = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", "pa", "root", *args],
                                   capture_output=True, text=True)
                _probe[kind] = "" if r.returncode == 0 else (r.stderr.strip() or f"exit {r.returncode}")
        finally:
            _ip("netns", "del", ns, check=False)
    return _probe


def netem_available() -> bool:
    """Whether this kernel has netem (delay, loss). Needs root, like the rest."""
    return _probe_qdiscs()["netem"] == ""


def require_tbf() -> None:
    """Skip unless namespaces can be made and tbf works in them (a kernel without sch_tbf is
    not fixed by an install, so this skips even with PARAMSHARD_REQUIRE_ENGINES=1)."""
    require_netns()
    problem = _probe_qdiscs()["tbf"]
    if problem:
        import pytest
        pytest.skip(f"tc tbf does not work here ({problem}): the kernel needs sch_tbf")


class ShapedLab(NetnsLab):
    """A NetnsLab whose hosts' links are rate-limited both ways; ``rate`` (tc units, e.g.
    ``"100mbit"``) shapes every host at once, None leaves them unshaped until :meth:`shape`.

    ``rates``: host -> its rate in bits/s (None: unshaped)."""

    def __init__(self, n_hosts: int, subnet: str = "10.213.7.0/24", *, rate: str | float | None = None,
                 latency: str = "50ms", **kwargs):
        super().__init__(n_hosts, subnet, **kwargs)
        self.rates: dict[int, float | None] = {i: None for i in range(n_hosts)}
        if rate is not None:
            try:
                self.shape(rate, latency=latency)
            except BaseException:
                self.close()
                raise

    def _tc(self, ns: str, *args: str) -> None:
        argv = ["ip", "netns", "exec", ns, "tc", *args]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise NetnsError(f"`{' '.join(argv)}` failed ({r.returncode}): {r.stderr.strip()}")

    def shape(self, rate: str | float, hosts: Iterable[int] | None = None, latency: str = "50ms") -> None:
        """Limit each of ``hosts`` (default: all) to ``rate`` sent and ``rate`` received."""
        args = tbf_args(rate, latency)
        for i in (range(len(self)) if hosts is None else hosts):
            self._tc(self.namespaces[i], "qdisc", "replace", "dev", "eth0", "root", *args)  # what it sends
            self._tc(self.bridge_ns, "qdisc", "replace", "dev", f"p{i}", "root", *args)    # what it receives
            self.rates[i] = parse_rate(rate)

    def unshape(self, hosts: Iterable[int] | None = None) -> None:
        """Remove the limits of ``hosts`` (default: all)."""
        for i in (range(len(self)) if hosts is None else hosts):
            if self.rates[i] is not None:
                self._tc(self.namespaces[i], "qdisc", "del", "dev", "eth0", "root")
                self._tc(self.bridge_ns, "qdisc", "del", "dev", f"p{i}", "root")
                self.rates[i] = None

    def counters(self) -> list[dict[str, int]]:
        """Per host, what crossed its link so far: ``tx_bytes``/``tx_packets`` (sent by the host),
        ``rx_bytes``/``rx_packets`` (received), read from the bridge ports in one call."""
        r = _ip("-s", "-j", "link", "show", ns=self.bridge_ns)
        ports = {link["ifname"]: link["stats64"] for link in json.loads(r.stdout)}
        out = []
        for i in range(len(self)):
            s = ports[f"p{i}"]   # the port receives what the host sends
            out.append({"tx_bytes": s["rx"]["bytes"], "tx_packets": s["rx"]["packets"],
                        "rx_bytes": s["tx"]["bytes"], "rx_packets": s["tx"]["packets"]})
        return out

    def transfer(self, src: int, dst: int, nbytes: int, port: int = 5201, timeout: float = 60.0) -> dict:
        """Send ``nbytes`` over one TCP connection from host ``src`` to host ``dst`` (both ends in
        their namespaces, bound to lab addresses). Returns ``bytes`` received, ``seconds`` (the
        receiver's, from accept to EOF), ``bits_per_s`` of payload, and the link counters'
        ``src_tx_bytes``/``dst_rx_bytes`` over the transfer."""
        receiver = self.run(dst, [sys.executable, "-c", _RECEIVER, self.addresses[dst], str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            ready = receiver.stdout.readline()  # the receiver listens before it says so
            if ready.strip() != "ready":
                raise NetnsError(f"the receiver on host {dst} did not start: {ready!r} {receiver.stderr.read()}")
            before = self.counters()
            sent = self.check_call(src, [sys.executable, "-c", _SENDER, self.addresses[dst], str(port), str(nbytes)],
                                   timeout=timeout)
            if sent.returncode != 0:
                raise NetnsError(f"the sender on host {src} failed: {sent.stderr.strip()}")
            out, err = receiver.communicate(timeout=timeout)
            after = self.counters()
        finally:
            if receiver.poll() is None:
                receiver.kill()
                receiver.wait(5)
        if receiver.returncode != 0:
            raise NetnsError(f"the receiver on host {dst} failed: {err.strip()}")
        result = json.loads(out)
        result["bits_per_s"] = result["bytes"] * 8 / result["seconds"]
        result["src_tx_bytes"] = after[src]["tx_bytes"] - before[src]["tx_bytes"]
        result["dst_rx_bytes"] = after[dst]["rx_bytes"] - before[dst]["rx_bytes"]
        return result


_RECEIVER = """
import json, socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
s.settimeout(60)
print("ready", flush=True)
c, _ = s.accept()
c.settimeout(60)
t0, n = time.perf_counter(), 0
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    n += len(b)
print(json.dumps({"bytes": n, "seconds": time.perf_counter() - t0}), flush=True)
"""

_SENDER = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
left, buf = int(sys.argv[3]), bytes(1 << 20)
while left > 0:
    c.sendall(buf[:min(left, len(buf))])
    left -= min(left, len(buf))
c.shutdown(socket.SHUT_WR)
c.recv(1)
c.close()
"""


class CounterSampler:
    """Samples :meth:`ShapedLab.counters` every ``interval`` seconds on a thread (a context
    manager), so that the bytes of a time window known only afterwards (e.g. a trainer's
    timed loop, as wall-clock times) can be read: :meth:`between`."""

    def __init__(self, lab: ShapedLab, interval: float = 0.25):
        self.lab, self.interval = lab, interval
        self.times: list[float] = []
        self.samples: list[list[dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="counter-sampler", daemon=True)
        self.error: BaseException | None = None

    def _sample(self) -> None:
        counters = self.lab.counters()
        self.times.append(time.time())
        self.samples.append(counters)

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                self._sample()
        except BaseException as exc:  # noqa: BLE001 - reported by between()
            self.error = exc

    def __enter__(self) -> "CounterSampler":
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
        if not self.lab._closed:
            self._sample()

    def at(self, t: float, host: int, key: str) -> float:
        """Counter ``key`` of ``host`` at wall time ``t``, interpolated between the samples around it."""
        if self.error is not None:
            raise NetnsError(f"the counter sampler failed: {self.error}")
        if not self.times or not self.times[0] <= t <= self.times[-1]:
            raise ValueError(f"time {t:.3f} is outside the samples ({self.times[0]:.3f}..{self.times[-1]:.3f})")
        j = bisect.bisect_left(self.times, t)
        if self.times[j] == t or j == 0:
            return float(self.samples[j][host][key])
        t0, t1 = self.times[j - 1], self.times[j]
        v0, v1 = self.samples[j - 1][host][key], self.samples[j][host][key]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0)

    def between(self, t0: float, t1: float, hosts: Iterable[int], key: str = "tx_bytes") -> float:
        """Sum over ``hosts`` of counter ``key``'s growth from wall time t0 to t1."""
        return sum(self.at(t1, h, key) - self.at(t0, h, key) for h in hosts)


# -- pytest fixture (import it into a test module: `from tests.engines.shaped import shaped_lab`) --

import pytest  # noqa: E402


@pytest.fixture
def shaped_lab():
    """A factory ``shaped_lab(n_hosts, subnet=..., rate=...) -> ShapedLab``; closed after the test."""
    yield from lab_factory(ShapedLab, require_tbf)
