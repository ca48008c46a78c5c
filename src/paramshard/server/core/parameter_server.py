"""One parameter server: a ZeroMQ ROUTER socket and a single-threaded loop.

Requests are validated, passed through the services' request hooks (accept,
hold, refuse: server/core/hooks.py), dispatched to the services' handlers, and
answered now or deferred (sync barrier, waiting for registration) on the one
waiting list (server/core/waiting.py). Services see this server only through a
ServerContext (server/core/context.py). A deferred request
that outlives the deadline gets an error reply naming what it waited for, so a
stuck peer never becomes a silent hang. Any failure while handling a request,
now or deferred, becomes an error reply and the loop goes on serving.

The server also ends with its job: once no trainer can push again (every one
left, or lost its connection for longer than the timeout) or a peer server is
gone, it stops, with exit code 1 and a line naming the lost ones if any (69,
peers.PEER_LOST_EXIT_CODE, for a lost peer server). One that no trainer ever
reaches stops too, after ``idle_exit`` seconds in which no request of a job
came (server/core/idle_watch.py), with exit code 1 and a line naming what it waited for.
"""
from __future__ import annotations

import socket
import threading
import time
import traceback
from collections import defaultdict

import zmq
from zmq.utils.monitor import recv_monitor_message

from paramshard.errors import Moved, ParamshardError, ProtocolError, StaleEpoch
from paramshard.limits import Limits
from paramshard.log import get_logger
from paramshard.mode import Mode
from paramshard.transport import protocol
from paramshard.transport.security import Security
from paramshard.transport.server_socket import bind_router
from paramshard.messages.server_stats import ServerStats, TrainerStates
from paramshard.server.core.api import Service
from paramshard.server.core.barrier import Membership
from paramshard.server.core.context import ServerContext
from paramshard.server.core.control_handlers import ControlHandlers
from paramshard.server.storage.dense_store import DenseStore
from paramshard.server.services.dense_handlers import DenseHandlers
from paramshard.server.core.hooks import Incoming, RequestHook, Verdict
from paramshard.server.core.idle_watch import IdleWatch
from paramshard.server.core.memory_budget import SMALL_REQUEST, STUCK_SECONDS, MemoryBudget
from paramshard.server.core.outbox import GO, HELD, Outbox, describe_identity
from paramshard.server.core.peers import PEER_LOST_EXIT_CODE, PeerWatch
from paramshard.server.core.replies import Deferred, Reply
from paramshard.server.elastic.shard_service import ShardService
from paramshard.server.services.trainer_barrier import TrainerBarriers
from paramshard.server.core.trainer_connections import TrainerConnections, peer_address
from paramshard.server.core.waiting import WaitingList

log = get_logger("server")

IN_PROCESS = "in-process:0"     # the address of a server without a socket (host:port, as any other)


class _SocketAnswer:
    """The answer to a waiting request goes back over the socket (an Answer: server/core/waiting.py)."""
    __slots__ = ("server", "identity", "request_id")

    def __init__(self, server: "ParameterServer", identity, request_id: int):
        self.server, self.identity, self.request_id = server, identity, request_id

    def reply(self, reply: Reply) -> None:
        self.server._reply(self.identity, self.request_id, reply)

    def error(self, code: str, message: str) -> None:
        self.server._send(self.identity, protocol.error_header(self.request_id, code, message))

    def failure(self, op: str, exc: Exception) -> None:
        self.server._send_failure(self.identity, self.request_id, op, exc)


class ParameterServer:
    def __init__(self, server_id: int, bind: str | None, num_trainers: int, mode: str | Mode = Mode.SYNC,
                 timeout: float = 120.0, exit_when_trainers_leave: bool = True, security: Security | None = None,
                 peers: dict[int, str] | None = None, limits: Limits = Limits(), min_trainers: int | None = None,
                 recovering: bool = False, max_staleness: int | None = None, idle_exit: float | None = None):
        """``bind`` is host:port; port 0 picks a free port (see ``address``). ``bind=None``: no
        socket at all, requests come only through ``handle_local`` (a server inside the
        trainer's process: server/core/in_process.py).
        ``peers``: index -> address of the job's other servers, watched so this one
        does not outlive them. ``security``: the job's CurveZMQ keys, None for plain TCP.
        ``idle_exit``: seconds after which a server nothing of its job reached stops, counted from
        its start and from each ``hello`` since (server/core/idle_watch.py); None: never."""
        self.server_id = server_id
        self.name = f"server {server_id}"
        self.mode = mode = Mode.parse(mode)
        self.num_trainers = num_trainers
        self.timeout = timeout
        self.exit_when_trainers_leave = exit_when_trainers_leave
        self.membership = Membership(num_trainers, grace=timeout, min_trainers=min_trainers)
        # Counts and seconds (deferred_wait_s) by name, in the order first counted.
        self.stats: defaultdict[str, float] = defaultdict(int, requests=0, bytes_in=0, bytes_out=0, errors=0,
                                                          timeouts=0)
        self.idle = IdleWatch(idle_exit)
        # Requests answered later, from the socket and from a trainer in this process alike.
        self.waiting = WaitingList(self.name, self.membership, timeout, self.stats)
        self.context = ServerContext(server_id, mode, self.membership, timeout, self.waiting,
                                     epoch=-1 if recovering else 0, resubmit=self._resubmitted,
                                     snapshot_stats=self.snapshot_stats)
        applies_on_arrival = not mode.waits_every_step      # async: the staleness bound applies
        self.dense = DenseStore(mode, self.membership, max_staleness if applies_on_arrival else None)
        self._handlers: dict = {}
        self._services: list[Service] = []
        self._hooks: list[RequestHook] = []
        self.add_service(DenseHandlers(self.dense))
        self.add_service(ControlHandlers(self.context))
        self.add_service(TrainerBarriers(server_id, self.membership))
        self.add_service(ShardService(self.context))     # the data-shard queue (served by server 0)
        self.exit_code = 0
        self._ctx: zmq.Context = zmq.Context.instance()
        if bind is None:
            self._sock, self.address = None, IN_PROCESS
        else:
            self._sock, self.address = bind_router(self._ctx, bind, self.name, limits.max_message_bytes,
                                                   security=security)
        self._secure_peer = security.configure_client if security is not None else None
        self._peers = PeerWatch(self._ctx, peers or {}, grace=timeout, secure=self._secure_peer, me=server_id)
        # Replies each connection has not read yet, and its requests held back meanwhile:
        # what one client can make this server hold is bounded (server/core/outbox.py).
        self._outbox = Outbox(limits.max_queued_bytes, hold_seconds=timeout)
        # ... and what all of them together can (server/core/memory_budget.py): beyond it requests are
        # refused as busy.
        self.budget = MemoryBudget(limits.server_bytes, self._outbox)
        self._live_fds: set[int] = set()        # connections accepted and not reported closed since
        self._releasing = False     # the outbox let a held request through: more may follow at once
        # Which connection each trainer talks over, to notice a trainer that dies (trainer_connections.py).
        self._monitor = self._sock.get_monitor_socket(
            zmq.EVENT_DISCONNECTED | zmq.EVENT_ACCEPTED) if self._sock is not None else None
        self._connections = TrainerConnections()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._poller: zmq.Poller | None = None      # serve_forever's (follow_peers adds and removes peers)
        self._thread: threading.Thread | None = None
        # Where a request's time goes: decoding, each op's handler, encoding and sending the reply.
        self.phase_seconds: defaultdict[str, float] = defaultdict(float)
        self.started_at = time.time()
        self._cached_stats: tuple[float, dict | None] = (0.0, None)   # (monotonic time, snapshot): cached_stats()

    def add_service(self, service: Service) -> None:
        """Serve one more set of ops (e.g. sparse tables)."""
        clash = set(service.ops()) & set(self._handlers)
        if clash:
            raise ValueError(f"ops {sorted(clash)} are served twice")
        self._handlers.update(service.ops())
        self._services.append(service)
        self.context.services.append(service)
        self._hooks.extend(service.hooks())

    def service(self, kind: type):
        """The service of this class, None if none was added (e.g. the sparse tables)."""
        return next((s for s in self._services if isinstance(s, kind)), None)

    @property
    def generation(self) -> int:
        """The job's epoch on this server (client/recovery.py)."""
        return self.context.epoch

    def watch_peers(self, peers: dict[int, str], places: dict[int, str] | None = None) -> None:
        """Watch the other servers of the job, once their addresses are known (under
        ``paramshard run`` a server binds a free port before it learns the others')."""
        if self._ready.is_set():
            raise RuntimeError(f"{self.name}: watch_peers() after serving started")
        self._peers.close()
        self._peers = PeerWatch(self._ctx, peers, grace=self.timeout, secure=self._secure_peer, me=self.server_id)
        self.membership.places = dict(places or {})     # trainer -> the engine's name for it ("rank 3 on node7")

    def follow_peers(self, addresses) -> None:
        """The job's servers changed (a routing naming every index it had, "" for a removed one):
        watch those added by a scale like the others, stop watching those it removed. Called
        from a handler, so on the serving thread, which owns the poller."""
        poller = self._poller

        def watch(monitor) -> None:
            if poller is not None:
                poller.register(monitor, zmq.POLLIN)

        def unwatch(monitor) -> None:
            if poller is not None:
                poller.unregister(monitor)
        self._peers.follow(addresses, watch, unwatch)

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
        self.idle = IdleWatch(self.idle.limit)      # counted from serving's start, not the object's
        if self.idle.limit is not None:
            log.info("%s: exits if no trainer reaches it within %g s (--idle-exit / PARAMSHARD_IDLE_EXIT; "
                     "0: wait for ever)", self.name, self.idle.limit)
        sock, monitor = self._wire()
        poller = self._poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        for peer in self._peers.monitors:
            poller.register(peer, zmq.POLLIN)
        self._ready.set()
        next_check = 0.0
        try:
            while not self._stop.is_set():
                events = dict(poller.poll(self._poll_ms()))
                if monitor in events:
                    self._note_disconnects()
                if sock in events:
                    # Drain what has arrived before re-checking waits: one wakeup, many messages.
                    for _ in range(256):
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self._handle(frames)
                if self._outbox.has_held():
                    self._releasing = self._outbox.release(self._process, self._refuse, self._drop_held)
                self.waiting.answer_ready()
                if self.context.stopping and not len(self.waiting):
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
            sock.disable_monitor()
            monitor.close(0)
            sock.close(linger=1000)
            log.info("%s stopped", self.name)
        return self.exit_code

    def _job_ended(self) -> bool:
        """True (with ``exit_code`` set) when nothing is left to serve."""
        for hook in self._hooks:
            hook.tick()        # e.g. a checkpoint pause that outlived the timeout ends
        for trainer in self.membership.expire():
            log.error("%s: trainer %d did not come back within %g s: counted as lost", self.name,
                      trainer, self.timeout)
        gone_peers = self._peers.poll()
        if gone_peers:
            self.exit_code = PEER_LOST_EXIT_CODE      # the launcher reads it: failed because a peer did
            log.error("%s: stopping because %s is gone (unreachable for %g s); the job cannot go on "
                      "without it", self.name, ", ".join(gone_peers), self.timeout)
            return True
        if self.idle.expired():
            self.exit_code = 1
            log.error("%s", self._idle_message())
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

    def _idle_message(self) -> str:
        """Why a server that nothing reached stops, and what to do about it."""
        idle = self.idle
        since = (f"in the {idle.waited():.0f} s since it started" if not idle.probes else
                 f"in {idle.waited():.0f} s (only {idle.probes} hello(s) checking it was up, none for the "
                 f"last {idle.limit:g} s)")
        unseen = self._peers.never_reached()
        peers = (f"; peer servers it never reached either: {', '.join(unseen)}" if unseen else
                 "; every peer server was reached" if self._peers.peers else "")
        return (f"{self.name}: stopping: no trainer ever reached it on {self.address} {since}: it expected "
                f"{self.num_trainers} trainer(s) (PARAMSHARD_TRAINERS) to connect and register{peers}. Start "
                f"the trainers with PARAMSHARD_SERVERS naming this address, check that they can reach it (host, "
                f"port, firewall, the same PARAMSHARD_SECRET), or give them longer: --idle-exit SECONDS / "
                f"PARAMSHARD_IDLE_EXIT (now {idle.limit:g}; 0: wait for ever)")

    # -- request handling -----------------------------------------------
    def _poll_ms(self) -> int:
        # Held requests wait for replies to drain, which no socket event announces: look again soon.
        if self._releasing and self._outbox.has_held():
            return 0
        longest = 20 if self._outbox.has_held() else 200
        soonest = self.waiting.soonest_deadline()
        if soonest is None:
            return longest
        return max(0, min(longest, int((soonest - time.monotonic()) * 1000) + 1))

    def _handle(self, frames: list, resubmitted: bool = False) -> None:
        """A request off the socket: refused as busy when the server's memory budget cannot take
        it (server/core/memory_budget.py), else handled now, or held while its connection has too many
        unread replies (server/core/outbox.py), or refused when it holds too much already."""
        self.stats["requests"] += 1
        nbytes = sum(len(f) for f in frames[1:])
        self.stats["bytes_in"] += nbytes
        identity = frames[0].bytes
        if len(frames) > 1:
            self._outbox.note_fd(identity, frames[1].get(zmq.SRCFD))
        if not resubmitted and not self._budget_admits(nbytes):
            self._refuse_busy(frames, nbytes)
            return
        admitted = self._outbox.admit(identity, frames, nbytes)
        if admitted == GO:
            self._process(frames)
        elif admitted == HELD:
            self.stats["requests_held"] += 1
        else:
            self._refuse(frames)

    def _resubmitted(self, frames: list) -> None:
        """A request a hook held goes on (context.resubmit): it was admitted already."""
        self._handle(frames, resubmitted=True)

    def _budget_admits(self, nbytes: int) -> bool:
        """Room for a request of ``nbytes``? If not, the connections that read nothing go first."""
        budget = self.budget
        if budget.fits(nbytes):
            return True
        for identity, fd, queued in self._outbox.stuck(STUCK_SECONDS):
            self._evict(identity, fd, queued)
            if budget.fits(nbytes):
                return True
        return False

    def _evict(self, identity: bytes, fd: int, queued: int) -> None:
        """Close a connection whose replies have waited STUCK_SECONDS (its peer reads nothing):
        shutting its socket down makes libzmq end the connection and free what was queued to it.
        Only a descriptor the monitor reported accepted and not closed since: never another one."""
        if fd not in self._live_fds:
            return
        try:
            with socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as dup:   # a duplicate: ours to close
                dup.shutdown(socket.SHUT_RDWR)
        except OSError as exc:
            log.warning("%s: could not close the connection of client %s: %s", self.name,
                        describe_identity(identity), exc)
            return
        self._live_fds.discard(fd)
        self.budget.evicted += 1
        log.warning("%s: closed the connection of client %s: %d bytes of replies it has not read for %g s "
                    "held the memory budget (PARAMSHARD_MAX_SERVER_BYTES=%d) other requests need", self.name,
                    describe_identity(identity), queued, STUCK_SECONDS, self.budget.limit)

    def _refuse_busy(self, frames: list, nbytes: int) -> None:
        """Answer ``busy``: the client retries after a short backoff (transport/busy.py)."""
        self.budget.refused += 1
        message = self.budget.busy_message(self.name, nbytes)
        if self.budget.refused == 1 or self.budget.refused % 1000 == 0:
            log.warning("%s: refused a request as busy (%d so far): %s", self.name, self.budget.refused, message)
        request_id = protocol.request_id_of(frames[1].buffer) if len(frames) > 1 else -1
        del frames[1:]          # its bytes go now, not after the reply is queued
        self._send(frames[0], protocol.error_header(request_id, "busy", message))

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
                        describe_identity(identity), peer_address(frames[1]) if len(frames) > 1 else "?", message)
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
            request = Incoming(op, header, header.get("trainer"), held=frames)
            if self._admit(request) is Verdict.HOLD:
                # A hook keeps it and hands it back through context.resubmit: counted in the budget
                # until its frames are freed.
                self.budget.hold(frames[-1], sum(len(f) for f in rest))
                return
            trainer = request.trainer
            started = time.perf_counter()
            arrays = protocol.decode_arrays(header, rest[1:])
            self.phase_seconds["decode"] += time.perf_counter() - started
            outcome = self._run(request, arrays)
        except Exception as exc:   # noqa: BLE001 - no request may take the server down
            self._send_failure(identity, request_id, op, exc)
            return
        # Only an accepted request ties its connection to a trainer: a stranger's
        # rejected message naming trainer 1 must not make trainer 1 "lost" when it hangs up.
        if trainer is not None and self._connections.tie(rest[0].get(zmq.SRCFD), trainer):
            self.membership.note_request(trainer, peer_address(rest[0]))
        if isinstance(outcome, Deferred):
            self.waiting.add(_SocketAnswer(self, identity, request_id), op, outcome)
        else:
            self._reply(identity, request_id, outcome)

    def _admit(self, request: Incoming) -> Verdict:
        """Checks every request passes before its handler runs: the trainer it names belongs to
        the job, then each service's hooks in turn (a refusal raises)."""
        trainer = request.trainer
        if trainer is not None:
            if type(trainer) is not int:
                raise ProtocolError(f"{request.op}: field 'trainer' must be int, got {type(trainer).__name__}")
            self.membership.check_trainer(trainer)
        # Before the hooks: a trainer refused for now (a stale epoch while a restarted server
        # waits for its restore) still found this server.
        self.idle.note(request.op)
        for hook in self._hooks:
            if hook.admit(request) is Verdict.HOLD:
                return Verdict.HOLD
        return Verdict.ACCEPT

    def _run(self, request: Incoming, arrays: list) -> Reply | Deferred:
        started = time.perf_counter()
        outcome = self._dispatch(request.op)(request.header, arrays)
        self.phase_seconds[request.op] += time.perf_counter() - started
        for hook in self._hooks:
            hook.applied(request)
        return outcome

    def handle_local(self, header: dict, arrays: list) -> Reply | Deferred:
        """One request from a trainer in this process (server/core/in_process.py): the socket
        path's checks and handlers, without encoding anything. Raises what the socket
        path turns into an error reply (``failure_reply`` gives that reply)."""
        self.stats["requests"] += 1
        protocol.validate_request(header)
        op = header["op"]
        self.stats[f"op_{op}"] += 1
        # held=None: nothing is held here (hooks.Incoming): the one in-process trainer saves
        # between its own steps, so no push can arrive during a checkpoint's cut.
        request = Incoming(op, header, header.get("trainer"))
        self._admit(request)
        trainer = request.trainer
        outcome = self._run(request, arrays)
        if trainer is not None:
            self.membership.note_request(trainer, IN_PROCESS)
        return outcome

    def failure_reply(self, op: str, exc: Exception) -> tuple[str, str]:
        """(code, message) of the error reply for a request that raised ``exc``."""
        self.stats["errors"] += 1
        if isinstance(exc, ParamshardError):
            code = ("bad_request" if isinstance(exc, ProtocolError) else
                    "reset" if isinstance(exc, StaleEpoch) else getattr(exc, "wire_code", "invalid"))
            if code == "moved":         # routine during a move of partitions: not worth a warning
                return code, str(exc)
            log.warning("%s: rejected %s request: %s", self.name, op, exc)
            return code, str(exc)
        log.error("%s: internal error on %s: %s", self.name, op, traceback.format_exc())
        return "internal", f"internal: {op} failed on {self.name}: {type(exc).__name__}: {exc}"

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

    def _wire(self) -> tuple[zmq.Socket, zmq.Socket]:
        """The ROUTER socket and its monitor. Only the socket path comes here: start() refuses a
        server made with bind=None, which answers through handle_local."""
        if self._sock is None or self._monitor is None:
            raise RuntimeError(f"{self.name} has no socket (bind=None): it serves through handle_local only")
        return self._sock, self._monitor

    def _note_disconnects(self) -> None:
        _, monitor = self._wire()
        while monitor.poll(0):
            event = recv_monitor_message(monitor)
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._live_fds.add(int(event["value"]))
            else:
                self._live_fds.discard(int(event["value"]))
            trainer = self._connections.event(event["event"], int(event["value"]))
            if trainer is not None and self.membership.connection_lost(trainer):
                if self.context.retired:
                    # A scale removed this server: each trainer closes its link to it once it routes
                    # without it, as it should. Not a loss: no warning (it exits once told to).
                    log.info("%s: trainer %d closed its connection to this retired server", self.name, trainer)
                    self.membership.leave(trainer)     # nothing to wait for: not lost, no grace period
                    for service in self._services:
                        service.on_leave(trainer)
                    continue
                if self.membership.elastic:
                    # An elastic job goes on without it: steps that only waited for it complete now.
                    log.warning("%s: trainer %d lost its connection without leaving%s; the job goes on "
                                "without it (%d training)", self.name, trainer, self.membership.where([trainer]),
                                len(self.membership.live))
                    for service in self._services:
                        service.on_leave(trainer)
                    continue
                log.error("%s: trainer %d lost its connection without leaving (died?)%s; it has %g s "
                          "to come back", self.name, trainer, self.membership.where([trainer]), self.timeout)

    def _reply(self, identity, request_id: int, reply: Reply) -> None:
        started = time.perf_counter()
        self._send(identity, protocol.ok_header(request_id, **reply.fields), reply.arrays)
        self.phase_seconds["reply"] += time.perf_counter() - started

    def _send(self, identity, header: dict, arrays=()) -> None:
        """Queue a reply without ever blocking the loop. A peer whose pipe is full (SNDHWM replies
        it does not read) or that is gone gets nothing: the reply is dropped and counted, with
        one warning per connection. A sent reply counts against its connection until libzmq
        releases it (server/core/outbox.py)."""
        frames = protocol.encode(header, arrays)
        self.stats["bytes_out"] += sum(a.nbytes for a in arrays)
        key = identity.bytes if isinstance(identity, zmq.Frame) else bytes(identity)
        nbytes = sum(memoryview(f).nbytes for f in frames)
        # Tracked: the last frame zero-copy with a tracker. libzmq sends a connection's frames in
        # order, so once it releases that one the reply (and every earlier one) has left the process.
        track = self._outbox.track(key, nbytes)
        last = zmq.Frame(frames[-1], copy=False, track=True) if track else frames[-1]
        sock, _ = self._wire()
        try:
            sock.send(identity, zmq.NOBLOCK | zmq.SNDMORE, copy=False)   # Again / unreachable: nothing queued
            for frame in frames[:-1]:
                sock.send(frame, zmq.NOBLOCK | zmq.SNDMORE, copy=False)
            tracker = sock.send(last, zmq.NOBLOCK, copy=False, track=track)
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
        if nbytes > SMALL_REQUEST:
            self.budget.note_peak()

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
        """The ``stats`` reply (messages/server_stats.py): the loop's counters and each service's part."""
        m = self.membership
        return ServerStats.assemble(
            [self._outbox.stats(), *(service.stats() for service in self._services)],
            server=self.server_id, address=self.address, uptime_s=round(time.time() - self.started_at, 3),
            started_at=self.started_at,
            trainers=TrainerStates(tuple(sorted(m.live)), tuple(sorted(m.left)), tuple(sorted(m.failed))),
            phase_seconds={k: round(v, 6) for k, v in self.phase_seconds.items()},
            counters={**self.stats, **self.budget.stats()},
        ).to_wire()
