"""CurveZMQ for every connection of a job (PARAMSHARD_SECRET / PARAMSHARD_KEYS_DIR).

With a secret set, each server's ROUTER socket is a CURVE server and each
trainer's DEALER a CURVE client. CurveZMQ (RFC 26, in libzmq) encrypts and
authenticates every message with per-connection transient keys and nonces, so
traffic is confidential, cannot be altered, and a recorded stream cannot be
replayed over another connection. A ZAP handler on the server accepts only the
job's client key: a process without the keys cannot complete the handshake, so
not a byte it sends reaches the server's request loop.

Keys come from one of two places:

* ``PARAMSHARD_SECRET`` + ``PARAMSHARD_JOB_ID``: two Curve25519 key pairs (the
  servers', the clients') derived with scrypt from the secret, salted with the
  job id, so two jobs sharing a secret still refuse each other;
* ``PARAMSHARD_KEYS_DIR``: key files as written by ``zmq.auth.create_certificates``
  (``server.key``/``server.key_secret``, ``client.key``/``client.key_secret``).
  A server needs ``server.key_secret`` and ``client.key``; a client needs
  ``server.key`` and ``client.key_secret``.

Nothing set: plain TCP. Processes started by hand get that; ``paramshard launch``
and ``paramshard run`` own every rank's environment and make a random secret per
job (``new_secret``) unless the user gave one or chose PARAMSHARD_INSECURE=1.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import secrets
import threading

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from paramshard.errors import ConfigError, ServerUnavailable
from paramshard.log import get_logger

log = get_logger("security")

# scrypt: a slow, memory-hard KDF, so a weak secret is costly to guess from a
# captured handshake. ~50 ms and 16 MiB once per process (cached).
_SCRYPT = {"n": 1 << 14, "r": 8, "p": 1}
_KDF_CONTEXT = b"paramshard curve keys v1"
ZAP_DOMAIN = "paramshard"
FIX_HINT = ("set the same PARAMSHARD_SECRET and PARAMSHARD_JOB_ID (or PARAMSHARD_KEYS_DIR) on every "
            "process of the job")


def new_secret() -> str:
    """A random secret for one job: 256 bits from the operating system's generator."""
    return secrets.token_urlsafe(32)


class HandshakeRefused(ServerUnavailable):
    """The server is there but the CurveZMQ handshake failed: the keys do not match."""


@dataclasses.dataclass(frozen=True)
class Security:
    """The keys of one job, z85-encoded as libzmq takes them. A secret half is
    None when this process was not given it (a keys directory without it)."""

    server_public: bytes
    client_public: bytes
    server_secret: bytes | None = dataclasses.field(default=None, repr=False)
    client_secret: bytes | None = dataclasses.field(default=None, repr=False)
    origin: str = ""   # where the keys came from, for error messages

    # -- where keys come from ---------------------------------------------
    @classmethod
    def from_secret(cls, secret: str | bytes, job_id: str = "") -> "Security":
        if not secret:
            raise ConfigError("PARAMSHARD_SECRET is empty")
        if isinstance(secret, str):
            secret = secret.encode()
        server_sk, client_sk = _derive(secret, job_id)
        return cls(server_public=zmq.curve_public(server_sk), client_public=zmq.curve_public(client_sk),
                   server_secret=server_sk, client_secret=client_sk,
                   origin=f"PARAMSHARD_SECRET with PARAMSHARD_JOB_ID={job_id!r}")

    @classmethod
    def from_keys_dir(cls, path: str | os.PathLike) -> "Security":
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise ConfigError(f"PARAMSHARD_KEYS_DIR={path!r} is not a directory")
        keys = {}
        for name in ("server", "client"):
            public = secret = None
            secret_file = os.path.join(path, f"{name}.key_secret")
            public_file = os.path.join(path, f"{name}.key")
            try:
                if os.path.exists(secret_file):
                    public, secret = zmq.auth.load_certificate(secret_file)
                elif os.path.exists(public_file):
                    public, _ = zmq.auth.load_certificate(public_file)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"PARAMSHARD_KEYS_DIR: cannot read {name} key: {exc}") from None
            if public is None:
                raise ConfigError(f"PARAMSHARD_KEYS_DIR={path!r} has neither {name}.key nor "
                                  f"{name}.key_secret (make them with zmq.auth.create_certificates)")
            keys[name] = (public, secret)
        return cls(server_public=keys["server"][0], client_public=keys["client"][0],
                   server_secret=keys["server"][1], client_secret=keys["client"][1],
                   origin=f"PARAMSHARD_KEYS_DIR={path!r}")

    @classmethod
    def from_env(cls, env) -> "Security | None":
        """The job's security from a ClusterEnv: keys directory, secret, or None (plain TCP)."""
        if env.keys_dir and env.secret:
            raise ConfigError("set PARAMSHARD_SECRET or PARAMSHARD_KEYS_DIR, not both")
        if env.keys_dir:
            return cls.from_keys_dir(env.keys_dir)
        if env.secret:
            return cls.from_secret(env.secret, env.job_id)
        return None

    # -- sockets ------------------------------------------------------------
    def configure_client(self, sock: zmq.Socket) -> None:
        """Make a not yet connected socket a CURVE client of the job's servers."""
        if self.client_secret is None:
            raise ConfigError(f"{self.origin}: no client secret key (client.key_secret) for this process")
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server_public)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.client_public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.client_secret)

    def server_context(self) -> "CurveContext":
        """A context of its own whose ZAP handler accepts only the job's client key.

        ZAP is per context: a private one keeps two servers with different keys
        in one process (tests, standalone runs) from judging each other's clients.
        """
        if self.server_secret is None:
            raise ConfigError(f"{self.origin}: no server secret key (server.key_secret) for this process")
        return CurveContext(self)

    def configure_server(self, sock: zmq.Socket) -> None:
        if self.server_secret is None:
            raise ConfigError(f"{self.origin}: no server secret key (server.key_secret) for this process")
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.server_public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.server_secret)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())


@functools.lru_cache(maxsize=16)
def _derive(secret: bytes, job_id: str) -> tuple[bytes, bytes]:
    """(server, client) Curve25519 secret keys, z85. Any 32 bytes are a valid
    Curve25519 secret key (libzmq clamps them)."""
    job = job_id.encode()
    salt = _KDF_CONTEXT + b"\0" + len(job).to_bytes(4, "big") + job
    material = hashlib.scrypt(secret, salt=salt, dklen=64, **_SCRYPT)
    return z85.encode(material[:32]), z85.encode(material[32:])


class _OnlyTheJobsClient:
    """ZAP credentials check: the job's client key and no other."""

    def __init__(self, client_public: bytes):
        self.client_public = client_public

    def callback(self, domain: str, key: bytes) -> bool:
        if key == self.client_public:
            return True
        log.warning("refused a connection with client key %s: it knows the server key but not the "
                    "job's client key", key.decode(errors="replace"))
        return False


class CurveContext:
    """A private zmq.Context with a running ZAP handler; ``close()`` stops both."""

    def __init__(self, security: Security):
        self.security = security
        self.context = zmq.Context()
        self._auth = ThreadAuthenticator(self.context)
        self._auth.start()
        self._auth.configure_curve_callback(ZAP_DOMAIN, _OnlyTheJobsClient(security.client_public))
        self._closed = False
        self._lock = threading.Lock()

    def close(self) -> None:
        """Stop the ZAP handler and terminate the context (its sockets must be closed)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._auth.stop()
        self.context.term()
