"""One parameter server: a ZeroMQ ROUTER socket and a single-threaded loop.

Requests are validated, dispatched to ``handle_<op>`` methods, and answered
now or deferred (sync barrier, waiting for registration). A deferred request
that outlives the deadline gets an error reply naming what it waited for, so a
stuck peer never becomes a silent hang. A bad request gets an error reply and
the loop goes on serving.
"""
from __future__ import annotations

import threading
import time
import traceback
from collections import Counter

import zmq
from zmq.utils.monitor import recv_monitor_message

from ..errors import ConfigError, ParamshardError, ProtocolError
from ..log import get_logger
from ..transport import protocol
from ..transport.auth import MessageAuth
from .dense import DenseStore
from .dense_handlers import DenseHandlers
from .replies import Deferred, Reply

log = get_logger("server")


class _Waiting:
    __slots__ = ("identity", "request_id", "op", "deferred", "deadline")

    def __init__(self, identity, request_id, op, deferred, deadline):
        self.identity, self.request_id, self.op = identity, request_id, op
        self.deferred, self.deadline = deferred, deadline


class ParameterServer:
    def __init__(self, server_id: int, bind: str, num_trainers: int, mode: str = "sync",
                 timeout: float = 120.0, exit_when_trainers_leave: bool = True, secret: str | None = None):
        """``bind`` is host:port; port 0 picks a free port (see ``address``)."""
        self.server_id = server_id
        self.name = f"server {server_id}"
        self.mode = mode
        self.num_trainers = num_trainers
        self.timeout = timeout
        self.exit_when_trainers_leave = exit_when_trainers_leave
        self._auth = MessageAuth(secret)
        self.dense = DenseStore(mode, num_trainers)
        self._dense_handlers = DenseHandlers(self.dense)
        self._extra_handlers: dict = {}
        self._leave_hooks: list = []
        self._stats_providers: list = []
        self._stop_after_replies = False   # set by leave/shutdown: finish answering, then stop
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 1000)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a vanished client raises, not drops
        host, _, port = bind.rpartition(":")
        if port == "0":
            port_num = self._sock.bind_to_random_port(f"tcp://{host}")
        else:
            try:
                self._sock.bind(f"tcp://{host}:{port}")
            except zmq.ZMQError as exc:
                self._sock.close(0)
                raise ConfigError(f"{self.name} cannot bind {bind}: {exc} (port taken? wrong host?)") from None
            port_num = int(port)
        self.address = f"{host}:{port_num}"
        self._waiting: list[_Waiting] = []
        # Which connection each trainer talks over, to notice a trainer that dies:
        # its TCP connection drops and the monitor reports that socket's fd.
        self._monitor = self._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._trainer_by_fd: dict[int, int] = {}
        self.lost_trainers: set[int] = set()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = Counter(requests=0, bytes_in=0, bytes_out=0, errors=0, timeouts=0)
        self.started_at = time.time()

    def add_service(self, handlers: dict, stats=None, on_leave=None) -> None:
        """Plug in more ops (e.g. sparse tables): {op: callable(header, arrays)},
        a callable adding to the statistics, and one told when a trainer leaves."""
        self._extra_handlers.update(handlers)
        if stats is not None:
            self._stats_providers.append(stats)
        if on_leave is not None:
            self._leave_hooks.append(on_leave)

    # -- lifecycle ------------------------------------------------------
    def start(self) -> "ParameterServer":
        self._thread = threading.Thread(target=self.serve_forever, name=self.name, daemon=True)
        self._thread.start()
        return self

    def wait_ready(self, timeout: float = 10.0) -> None:
        if not self._ready.wait(timeout):
            raise ParamshardError(f"{self.name} did not start within {timeout} s")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def serve_forever(self) -> None:
        log.info("%s serving on %s (%s mode, %d trainers)", self.name, self.address,
                 self.mode, self.num_trainers)
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        self._ready.set()
        try:
            while not self._stop.is_set():
                events = dict(poller.poll(self._poll_ms()))
                if self._monitor in events:
                    self._note_disconnects()
                if self._sock in events:
                    # Drain what has arrived before re-checking waits: one wakeup, many messages.
                    for _ in range(256):
                        try:
                            frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self._handle(frames)
                self._answer_waiting()
                if self._stop_after_replies and not self._waiting:
                    break
        finally:
            self._sock.disable_monitor()
            self._monitor.close(0)
            self._sock.close(linger=1000)
            log.info("%s stopped", self.name)

    # -- request handling -----------------------------------------------
    def _poll_ms(self) -> int:
        if not self._waiting:
            return 200
        soonest = min(w.deadline for w in self._waiting)
        return max(0, min(200, int((soonest - time.monotonic()) * 1000) + 1))

    def _handle(self, frames: list) -> None:
        identity, rest = frames[0], frames[1:]
        self.stats["requests"] += 1
        self.stats["bytes_in"] += sum(len(f) for f in rest)
        request_id, op = -1, "?"
        try:
            if not rest:
                raise ProtocolError("empty message: expected [header, frames...]")
            rest = self._auth.verify(rest)
            header = protocol.decode_header(rest[0].buffer)
            self._auth.check_header(header)
            request_id = header["id"]
            protocol.validate_request(header)
            op = header["op"]
            self.stats[f"op_{op}"] += 1
            if isinstance(header.get("trainer"), int) and header["trainer"] >= 0:
                self._trainer_by_fd[rest[0].get(zmq.SRCFD)] = header["trainer"]
            arrays = protocol.decode_arrays(header, rest[1:])
            outcome = self._dispatch(op)(header, arrays)
        except ParamshardError as exc:
            self.stats["errors"] += 1
            code = "bad_request" if isinstance(exc, ProtocolError) else "invalid"
            log.warning("%s: rejected %s request %s: %s", self.name, op, request_id, exc)
            self._send(identity, protocol.error_header(request_id, code, str(exc)))
            return
        except Exception as exc:  # a bug here must not take the server down
            self.stats["errors"] += 1
            log.error("%s: internal error on %s: %s", self.name, op, traceback.format_exc())
            self._send(identity, protocol.error_header(request_id, "internal", f"{type(exc).__name__}: {exc}"))
            return
        if isinstance(outcome, Deferred):
            self._waiting.append(_Waiting(identity, request_id, op, outcome,
                                          time.monotonic() + self.timeout))
        else:
            self._reply(identity, request_id, outcome)

    def _dispatch(self, op: str):
        handler = self._extra_handlers.get(op) or getattr(self, f"handle_{op}", None) \
            or getattr(self._dense_handlers, f"handle_{op}", None)
        if handler is None:
            raise ProtocolError(f"op {op!r} is not served by this server (sparse tables not enabled?)")
        return handler

    def _note_disconnects(self) -> None:
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)
            trainer = self._trainer_by_fd.pop(int(event["value"]), None)
            if trainer is not None and trainer in self.dense.live_trainers:
                self.lost_trainers.add(trainer)
                log.error("%s: trainer %d lost its connection without leaving (died?)", self.name, trainer)

    def _lost_peers(self, deferred: Deferred) -> list[int]:
        if not self.lost_trainers or deferred.waits_on is None:
            return []
        return sorted(set(deferred.waits_on()) & self.lost_trainers)

    def _answer_waiting(self) -> None:
        if not self._waiting:
            return
        now = time.monotonic()
        still = []
        for w in self._waiting:
            try:
                lost = self._lost_peers(w.deferred)
                if w.deferred.ready():
                    self._reply(w.identity, w.request_id, w.deferred.make_reply())
                elif lost:
                    msg = (f"{self.name} cannot finish {w.op}: trainers {lost} lost their connection "
                           f"without leaving (died?); {w.deferred.describe()}")
                    self._send(w.identity, protocol.error_header(w.request_id, "peer_lost", msg))
                elif now >= w.deadline:
                    self.stats["timeouts"] += 1
                    msg = (f"{self.name} gave up on {w.op} after {self.timeout:g} s: "
                           f"{w.deferred.describe()}")
                    log.warning(msg)
                    self._send(w.identity, protocol.error_header(w.request_id, "timeout", msg))
                else:
                    still.append(w)
            except ParamshardError as exc:
                self._send(w.identity, protocol.error_header(w.request_id, "invalid", str(exc)))
        self._waiting = still

    def _reply(self, identity, request_id: int, reply: Reply) -> None:
        self._send(identity, protocol.ok_header(request_id, **reply.fields), reply.arrays)

    def _send(self, identity, header: dict, arrays=()) -> None:
        frames = self._auth.sign(protocol.encode(header, arrays, signed=self._auth.enabled))
        self.stats["bytes_out"] += sum(a.nbytes for a in arrays)
        try:
            self._sock.send_multipart([identity, *frames], copy=False)
        except zmq.ZMQError as exc:   # client went away: nothing to answer
            log.warning("%s: could not answer a client that left: %s", self.name, exc)

    # -- generic ops ------------------------------------------------------
    def handle_hello(self, header, arrays) -> Reply:
        return Reply({"server": self.server_id, "mode": self.mode, "trainers": self.num_trainers})

    def handle_stats(self, header, arrays) -> Reply:
        return Reply({"stats": self.snapshot_stats()})

    def handle_leave(self, header, arrays) -> Reply:
        trainer = header["trainer"]
        self.dense.leave(trainer)
        for hook in self._leave_hooks:
            hook(trainer)
        log.info("%s: trainer %d left (%d still training)", self.name, trainer,
                 len(self.dense.live_trainers))
        if self.exit_when_trainers_leave and not self.dense.live_trainers:
            self._stop_after_replies = True
        return Reply()

    def handle_shutdown(self, header, arrays) -> Reply:
        self._stop_after_replies = True
        return Reply()

    def snapshot_stats(self) -> dict:
        out = {"server": self.server_id, "address": self.address,
               "dense_blocks": len(self.dense.blocks), "dense_elements": self.dense.elements,
               "uptime_s": round(time.time() - self.started_at, 3)}
        out.update(self.stats)
        for provider in self._stats_providers:
            out.update(provider())
        return out
