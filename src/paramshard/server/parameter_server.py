"""One parameter server: a ZeroMQ ROUTER socket and a single-threaded loop.

Requests are validated, dispatched to the services' handlers, and answered
now or deferred (sync barrier, waiting for registration). A deferred request
that outlives the deadline gets an error reply naming what it waited for, so a
stuck peer never becomes a silent hang. Any failure while handling a request,
now or deferred, becomes an error reply and the loop goes on serving.

The server also ends with its job: once no trainer can push again (every one
left, or lost its connection for longer than the timeout) or a peer server is
gone, it stops, with exit code 1 and a line naming the lost ones if any (69,
peers.PEER_LOST_EXIT_CODE, for a lost peer server).
"""
from __future__ import annotations

import threading
import time
import traceback
from collections import Counter

import zmq
from zmq.utils.monitor import recv_monitor_message

from ..errors import ConfigError, ParamshardError, ProtocolError, StaleEpoch
from ..limits import Limits
from ..log import get_logger
from ..transport import protocol
from ..transport.security import Security
from ..transport.server_socket import bind_router
from .api import Service
from .barrier import Membership
from .control_handlers import ControlHandlers
from .dense import DenseStore
from .dense_handlers import DenseHandlers
from .outbox import GO, HELD, Outbox, describe_identity
from .peers import PEER_LOST_EXIT_CODE, PeerWatch
from .push_gate import PushGate
from .replies import Deferred, Reply
from .trainer_barrier import TrainerBarriers

log = get_logger("server")


class _Waiting:
    __slots__ = ("identity", "request_id", "op", "deferred", "deadline")

    def __init__(self, identity, request_id, op, deferred, deadline):
        self.identity, self.request_id, self.op = identity, request_id, op
        self.deferred, self.deadline = deferred, deadline


PUSH_OPS = ("push_dense", "push_sparse")
IN_PROCESS = "in-process:0"     # the address of a server without a socket (host:port, as any other)
DATA_OPS = ("push_dense", "push_sparse", "pull_dense", "pull_sparse")
# Requests that belong to an epoch: refused in another (a barrier entered before a rollback
# must not count after it).
EPOCH_OPS = DATA_OPS + ("barrier",)


def _peer_address(frame) -> str | None:
    """The IP address a message came from (libzmq's Peer-Address property)."""
    try:
        return frame.get("Peer-Address")
    except (zmq.ZMQError, AttributeError):
        return None


class ParameterServer:
    def __init__(self, server_id: int, bind: str | None, num_trainers: int, mode: str = "sync",
                 timeout: float = 120.0, exit_when_trainers_leave: bool = True, security: Security | None = None,
                 peers: dict[int, str] | None = None, limits: Limits = Limits(), min_trainers: int | None = None,
                 recovering: bool = False, max_staleness: int | None = None):
        """``bind`` is host:port; port 0 picks a free port (see ``address``). ``bind=None``: no
        socket at all, requests come only through ``handle_local`` (a server inside the
        trainer's process: server/in_process.py).
        ``peers``: index -> address of the job's other servers, watched so this one
        does not outlive them. ``security``: the job's CurveZMQ keys, None for plain TCP."""
        self.server_id = server_id
        self.name = f"server {server_id}"
        self.mode = mode
        self.num_trainers = num_trainers
        self.timeout = timeout
        self.exit_when_trainers_leave = exit_when_trainers_leave
        self.membership = Membership(num_trainers, grace=timeout, min_trainers=min_trainers)
        self.dense = DenseStore(mode, self.membership, max_staleness if mode == "async" else None)
        self._handlers: dict = {}
        self._services: list[Service] = []
        self.add_service(DenseHandlers(self.dense))
        self.add_service(ControlHandlers(self))
        self.add_service(TrainerBarriers(server_id, self.membership))
        self._stop_after_replies = False   # set by leave/shutdown: finish answering, then stop
        self.exit_code = 0
        self._ctx = zmq.Context.instance()
        if bind is None:
            self._sock, self.address = None, IN_PROCESS
        else:
            self._sock, self.address = bind_router(self._ctx, bind, self.name, limits.max_message_bytes,
                                                   security=security)
        self._secure_peer = security.configure_client if security is not None else None
        self._peers = PeerWatch(self._ctx, peers or {}, grace=timeout, secure=self._secure_peer, me=server_id)
        self._waiting: list[_Waiting] = []
        # Replies each connection has not read yet, and its requests held back meanwhile:
        # what one client can make this server hold is bounded (server/outbox.py).
        self._outbox = Outbox(limits.max_queued_bytes, hold_seconds=timeout)
        self._releasing = False     # the outbox let a held request through: more may follow at once
        self.gate = PushGate(timeout)       # async checkpoints: holds pushes for a consistent cut
        # The job's epoch (client/recovery.py): data requests of another epoch are refused. A
        # server restarted in place starts at -1: it serves nothing until the chief resets it.
        self.generation = -1 if recovering else 0
        # Which connection each trainer talks over, to notice a trainer that dies:
        # its TCP connection drops and the monitor reports that socket's fd.
        self._monitor = self._sock.get_monitor_socket(
            zmq.EVENT_DISCONNECTED | zmq.EVENT_ACCEPTED) if self._sock is not None else None
        self._trainer_by_fd: dict[int, int] = {}
        # Connections reported closed whose descriptor was not reused since: a message
        # still queued from one of them is not a trainer coming back (the disconnect
        # event can overtake the last messages the connection delivered).
        self._closed_fds: set[int] = set()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = Counter(requests=0, bytes_in=0, bytes_out=0, errors=0, timeouts=0)
        # Where a request's time goes: decoding, each op's handler, encoding and sending the reply.
        self.phase_seconds: Counter = Counter()
        self.started_at = time.time()
        self._cached_stats: tuple[float, dict | None] = (0.0, None)   # (monotonic time, snapshot): cached_stats()

    def add_service(self, service: Service) -> None:
        """Serve one more set of ops (e.g. sparse tables)."""
        clash = set(service.ops()) & set(self._handlers)
        if clash:
            raise ValueError(f"ops {sorted(clash)} are served twice")
        self._handlers.update(service.ops())
        self._services.append(service)

    def watch_peers(self, peers: dict[int, str], places: dict[int, str] | None = None) -> None:
        """Watch the other servers of the job, once their addresses are known (under
        ``paramshard run`` a server binds a free port before it learns the others')."""
        if self._ready.is_set():
            raise RuntimeError(f"{self.name}: watch_peers() after serving started")
        self._peers.close()
        self._peers = PeerWatch(self._ctx, peers, grace=self.timeout, secure=self._secure_peer, me=self.server_id)
        self.membership.places = dict(places or {})     # trainer -> the engine's name for it ("rank 3 on node7")

    # -- lifecycle ------------------------------------------------------
    def start(self) -> "ParameterServer":
        if self._sock is None:
            raise RuntimeError(f"{self.name} has no socket (bind=None): it serves through handle_local only")
        self._thread = threading.Thread(target=self.serve_forever, name=self.name, daemon=True)
        self._thread.start()
        return self

    def wait_ready(self, timeout: float = 10.0) -> None:
        if not self._ready.wait(timeout):
            raise ParamshardError(f"{self.name} did not start within {timeout} s")

    def close(self) -> None:
        if self._sock is None:       # in-process: nothing runs, only the (empty) peer watch to close
            self._peers.close()
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def serve_forever(self) -> int:
        """Serve until the job ends; returns the exit code (0: every trainer left)."""
        log.info("%s serving on %s (%s mode, %d trainers)", self.name, self.address,
                 self.mode, self.num_trainers)
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        for monitor in self._peers.monitors:
            poller.register(monitor, zmq.POLLIN)
        self._ready.set()
        next_check = 0.0
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
                if self._outbox.has_held():
                    self._releasing = self._outbox.release(self._process, self._refuse, self._drop_held)
                self._answer_waiting()
                if self._stop_after_replies and not self._waiting:
                    break
                # Membership and peers change on a scale of seconds: checking them
                # ten times a second keeps them off the per-request path.
                now = time.monotonic()
                if now >= next_check:
                    next_check = now + 0.1
                    self._outbox.sweep()
                    self._refresh_cached_stats(now)
                    if self._job_ended():
                        break
        finally:
            self._peers.close()
            self._sock.disable_monitor()
            self._monitor.close(0)
            self._sock.close(linger=1000)
            log.info("%s stopped", self.name)
        return self.exit_code

    def _job_ended(self) -> bool:
        """True (with ``exit_code`` set) when nothing is left to serve."""
        if self.gate.expired():
            log.warning("%s: paused for a checkpoint for more than %g s without a resume (the chief died "
                        "mid-save?): applying the %d held pushes", self.name, self.timeout, len(self.gate.held))
            self.release(self.gate.resume())
        for trainer in self.membership.expire():
            log.error("%s: trainer %d did not come back within %g s: counted as lost", self.name,
                      trainer, self.timeout)
        gone_peers = self._peers.poll()
        if gone_peers:
            self.exit_code = PEER_LOST_EXIT_CODE      # the launcher reads it: failed because a peer did
            log.error("%s: stopping because %s is gone (unreachable for %g s); the job cannot go on "
                      "without it", self.name, ", ".join(gone_peers), self.timeout)
            return True
        if not self.exit_when_trainers_leave or not self.membership.job_over():
            return False
        if self.membership.enough_left():
            lost = sorted(self.membership.failed)
            log.info("%s: every trainer ended, %d left normally%s (--min-trainers %d)", self.name,
                     len(self.membership.left), f"; lost: {lost}" if lost else "", self.membership.min_trainers)
        elif self.membership.gone or self.membership.never_arrived():
            self.exit_code = 1
            log.error("%s: stopping: no trainer can push any more (%s)", self.name, self.membership.summary())
        else:
            log.info("%s: every trainer left", self.name)
        return True

    # -- request handling -----------------------------------------------
    def _poll_ms(self) -> int:
        # Held requests wait for replies to drain, which no socket event announces: look again soon.
        if self._releasing and self._outbox.has_held():
            return 0
        longest = 20 if self._outbox.has_held() else 200
        if not self._waiting:
            return longest
        soonest = min(w.deadline for w in self._waiting)
        return max(0, min(longest, int((soonest - time.monotonic()) * 1000) + 1))

    def _handle(self, frames: list) -> None:
        """A request off the socket: handled now, or held while its connection has too many
        unread replies (server/outbox.py), or refused when it holds too much already."""
        self.stats["requests"] += 1
        nbytes = sum(len(f) for f in frames[1:])
        self.stats["bytes_in"] += nbytes
        admitted = self._outbox.admit(frames[0].bytes, frames, nbytes)
        if admitted == GO:
            self._process(frames)
        elif admitted == HELD:
            self.stats["requests_held"] += 1
        else:
            self._refuse(frames)

    def _refuse(self, frames: list) -> None:
        """Answer a request of a connection over PARAMSHARD_MAX_QUEUED_BYTES with an error naming it
        (logged once per episode: such a client sends thousands)."""
        identity = frames[0].bytes
        conn = self._outbox.connection(identity)
        message = self._outbox.refusal(identity, self.name)
        self.stats["requests_refused"] += 1
        if not conn.warned_refuse:
            conn.warned_refuse = True
            log.warning("%s: client %s at %s does not read its replies: %s", self.name,
                        describe_identity(identity), _peer_address(frames[1]) if len(frames) > 1 else "?", message)
        request_id = protocol.request_id_of(frames[1].buffer) if len(frames) > 1 else -1
        self._send(frames[0], protocol.error_header(request_id, "overloaded", message))

    def _drop_held(self, frames: list) -> None:
        self.stats["held_dropped"] += 1     # its client is gone: nobody to answer

    def _process(self, frames: list) -> None:
        identity, rest = frames[0], frames[1:]
        request_id, op = -1, "?"
        try:
            if not rest:
                raise ProtocolError("empty message: expected [header, frames...]")
            request_id = protocol.request_id_of(rest[0].buffer)
            header = protocol.decode_header(rest[0].buffer)
            protocol.validate_request(header)
            op = header["op"]
            self.stats[f"op_{op}"] += 1
            trainer = self._admit(op, header)
            if op in PUSH_OPS and self.mode == "async" and self.gate.should_hold(trainer, header["step"]):
                self.gate.held.append((trainer, header["step"], frames))
                return
            started = time.perf_counter()
            arrays = protocol.decode_arrays(header, rest[1:])
            self.phase_seconds["decode"] += time.perf_counter() - started
            outcome = self._run(op, header, arrays, trainer)
        except Exception as exc:   # noqa: BLE001 - no request may take the server down
            self._send_failure(identity, request_id, op, exc)
            return
        fd = rest[0].get(zmq.SRCFD)
        if trainer is not None and fd not in self._closed_fds:
            # Only an accepted request ties its connection to a trainer: a stranger's
            # rejected message naming trainer 1 must not make trainer 1 "lost" when it hangs up.
            self.membership.note_request(trainer, _peer_address(rest[0]))
            self._trainer_by_fd[fd] = trainer
        if isinstance(outcome, Deferred):
            self._waiting.append(_Waiting(identity, request_id, op, outcome,
                                          time.monotonic() + self.timeout))
        else:
            self._reply(identity, request_id, outcome)

    def _admit(self, op: str, header: dict) -> int | None:
        """Checks every request passes before its handler runs; the trainer it names."""
        trainer = header.get("trainer")
        if trainer is not None:
            if type(trainer) is not int:
                raise ProtocolError(f"{op}: field 'trainer' must be int, got {type(trainer).__name__}")
            self.membership.check_trainer(trainer)
        if op in EPOCH_OPS and header.get("epoch", self.generation) != self.generation:
            raise StaleEpoch(f"{op} of epoch {header['epoch']} refused: {self.name} is in epoch "
                             f"{self.generation}" + (" (restarted, waiting for the chief to restore the "
                                                     "checkpoint)" if self.generation < 0 else
                                                     " (the job rolled back to a checkpoint)"))
        return trainer

    def _run(self, op: str, header: dict, arrays: list, trainer: int | None) -> Reply | Deferred:
        started = time.perf_counter()
        outcome = self._dispatch(op)(header, arrays)
        self.phase_seconds[op] += time.perf_counter() - started
        if op in PUSH_OPS:
            self.gate.note_applied("dense" if op == "push_dense" else f"sparse:{header['table']}",
                                   trainer, header["step"])
        return outcome

    def handle_local(self, header: dict, arrays: list) -> Reply | Deferred:
        """One request from a trainer in this process (server/in_process.py): the socket
        path's checks and handlers, without encoding anything. Raises what the socket
        path turns into an error reply (``failure_reply`` gives that reply)."""
        self.stats["requests"] += 1
        protocol.validate_request(header)
        op = header["op"]
        self.stats[f"op_{op}"] += 1
        trainer = self._admit(op, header)
        # A push is never held for an async checkpoint here: the one in-process trainer
        # saves between its own steps, so none can arrive during the cut.
        outcome = self._run(op, header, arrays, trainer)
        if trainer is not None:
            self.membership.note_request(trainer, IN_PROCESS)
        return outcome

    def failure_reply(self, op: str, exc: Exception) -> tuple[str, str]:
        """(code, message) of the error reply for a request that raised ``exc``."""
        self.stats["errors"] += 1
        if isinstance(exc, ParamshardError):
            code = ("bad_request" if isinstance(exc, ProtocolError) else
                    "reset" if isinstance(exc, StaleEpoch) else "invalid")
            log.warning("%s: rejected %s request: %s", self.name, op, exc)
            return code, str(exc)
        log.error("%s: internal error on %s: %s", self.name, op, traceback.format_exc())
        return "internal", f"internal: {op} failed on {self.name}: {type(exc).__name__}: {exc}"

    def release(self, held: list) -> None:
        """Handle pushes the gate held back, in their arrival order."""
        for _, _, frames in held:
            self._handle(frames)

    def _send_failure(self, identity, request_id: int, op: str, exc: Exception) -> None:
        """Turn any exception into an error reply: ours say what is wrong, anything
        else is a bug (or MemoryError) reported as ``internal`` with the op."""
        code, message = self.failure_reply(op, exc)
        self._send(identity, protocol.error_header(request_id, code, message))

    def _dispatch(self, op: str):
        handler = self._handlers.get(op)
        if handler is None:
            raise ProtocolError(f"op {op!r} is not served by this server (sparse tables not enabled?)")
        return handler

    def _note_disconnects(self) -> None:
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._closed_fds.discard(fd)     # the descriptor now belongs to a new connection
                continue
            self._closed_fds.add(fd)
            trainer = self._trainer_by_fd.pop(fd, None)
            if trainer is not None and self.membership.connection_lost(trainer):
                log.error("%s: trainer %d lost its connection without leaving (died?)%s; it has %g s "
                          "to come back", self.name, trainer, self.membership.where([trainer]), self.timeout)

    def _answer_waiting(self) -> None:
        if not self._waiting:
            return
        now = time.monotonic()
        still = []
        for w in self._waiting:
            try:
                if w.deferred.ready():
                    self._reply(w.identity, w.request_id, w.deferred.make_reply())
                    # How long requests queue behind a barrier or a bound (the run directory's queue_s).
                    self.stats["deferred_answered"] += 1
                    self.stats["deferred_wait_s"] += now - (w.deadline - self.timeout)
                    continue
                lost = self._lost_peers(w.deferred)
                if lost:
                    msg = (f"{self.name} cannot finish {w.op}: trainers {lost} lost their connection "
                           f"without leaving (died?){self.membership.where(lost)}; {w.deferred.describe()}")
                    self._send(w.identity, protocol.error_header(w.request_id, "peer_lost", msg))
                elif now >= w.deadline:
                    self.stats["timeouts"] += 1
                    msg = (f"{self.name} gave up on {w.op} after {self.timeout:g} s: "
                           f"{w.deferred.describe()}")
                    log.warning(msg)
                    self._send(w.identity, protocol.error_header(w.request_id, "timeout", msg))
                else:
                    still.append(w)
            except Exception as exc:   # noqa: BLE001 - a deferred reply may fail like any other
                self._send_failure(w.identity, w.request_id, w.op, exc)
        self._waiting = still

    def _lost_peers(self, deferred: Deferred) -> list[int]:
        failed = self.membership.failed
        if not failed or deferred.waits_on is None:
            return []
        return sorted(set(deferred.waits_on()) & failed)

    def _reply(self, identity, request_id: int, reply: Reply) -> None:
        started = time.perf_counter()
        self._send(identity, protocol.ok_header(request_id, **reply.fields), reply.arrays)
        self.phase_seconds["reply"] += time.perf_counter() - started

    def _send(self, identity, header: dict, arrays=()) -> None:
        """Queue a reply without ever blocking the loop. A peer whose pipe is full (SNDHWM replies
        it does not read) or that is gone gets nothing: the reply is dropped and counted, with
        one warning per connection. A sent reply counts against its connection until libzmq
        releases it (server/outbox.py)."""
        frames = protocol.encode(header, arrays)
        self.stats["bytes_out"] += sum(a.nbytes for a in arrays)
        key = identity.bytes if isinstance(identity, zmq.Frame) else bytes(identity)
        nbytes = sum(memoryview(f).nbytes for f in frames)
        # Tracked: the last frame zero-copy with a tracker. libzmq sends a connection's frames in
        # order, so once it releases that one the reply (and every earlier one) has left the process.
        track = self._outbox.track(key, nbytes)
        last = zmq.Frame(frames[-1], copy=False, track=True) if track else frames[-1]
        try:
            self._sock.send(identity, zmq.NOBLOCK | zmq.SNDMORE, copy=False)   # Again / unreachable: nothing queued
            for frame in frames[:-1]:
                self._sock.send(frame, zmq.NOBLOCK | zmq.SNDMORE, copy=False)
            tracker = self._sock.send(last, zmq.NOBLOCK, copy=False, track=track)
        except zmq.ZMQError as exc:
            self.stats["replies_dropped"] += 1
            conn = self._outbox.connection(key)
            conn.gone = exc.errno == zmq.EHOSTUNREACH
            if not conn.warned_drop:
                conn.warned_drop = True
                why = ("its queue is full: it does not read its replies" if isinstance(exc, zmq.Again)
                       else f"it is gone ({exc})")
                log.warning("%s: dropped a reply to client %s: %s (further drops to it are only counted, "
                            "stats replies_dropped)", self.name, describe_identity(key), why)
            return
        self._outbox.sent(key, tracker if track else None, nbytes)

    def fail_waiting(self, code: str, message: str) -> None:
        """Answer every waiting request with an error (a reset voids them)."""
        for w in self._waiting:
            self._send(w.identity, protocol.error_header(w.request_id, code, f"{message}; this {w.op} is void"))
        self._waiting = []

    def stop_after_replies(self) -> None:
        self._stop_after_replies = True

    @property
    def services(self) -> list[Service]:
        return list(self._services)

    def _refresh_cached_stats(self, now: float, max_age: float = 1.0) -> None:
        if now - self._cached_stats[0] >= max_age:
            # A new dict swapped in whole: readers in other threads never see one half-built.
            self._cached_stats = (now, self.snapshot_stats())

    def cached_stats(self) -> tuple[dict | None, float]:
        """(snapshot, its age in seconds) for other threads (a /metrics endpoint): the loop
        refreshes it about once a second, as only the loop may read its live counters.
        (None, age) before the loop's first refresh."""
        taken, snapshot = self._cached_stats
        return snapshot, time.monotonic() - taken

    def snapshot_stats(self) -> dict:
        out = {"server": self.server_id, "address": self.address,
               "uptime_s": round(time.time() - self.started_at, 3),
               "trainers": {"live": sorted(self.membership.live), "left": sorted(self.membership.left),
                            "lost": sorted(self.membership.failed)},
               "phase_seconds": {k: round(v, 6) for k, v in self.phase_seconds.items()}}
        out.update(self.stats)
        out.update(self._outbox.stats())
        for service in self._services:
            out.update(service.stats())
        return out
