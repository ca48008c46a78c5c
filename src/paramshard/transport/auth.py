"""Message authentication with a shared secret (PARAMSHARD_SECRET).

When a secret is set, every message gets one more frame: a keyed BLAKE2b
digest of all its other frames, and its header says ``"signed": true``. A
receiver with the secret drops any message whose digest does not match; one
without it refuses signed messages, so a half-configured job fails loudly.
"""
from __future__ import annotations

import hashlib
import hmac

from ..errors import ProtocolError

DIGEST_BYTES = 32


def _buffer(frame):
    return frame.buffer if hasattr(frame, "buffer") else frame


class MessageAuth:
    def __init__(self, secret: str | bytes | None):
        if isinstance(secret, str):
            secret = secret.encode()
        # blake2b takes keys up to 64 bytes; a longer secret is hashed down first.
        self.key = hashlib.blake2b(secret).digest() if secret and len(secret) > 64 else secret or None

    @property
    def enabled(self) -> bool:
        return self.key is not None

    def digest(self, frames) -> bytes:
        h = hashlib.blake2b(key=self.key, digest_size=DIGEST_BYTES)
        for f in frames:
            h.update(_buffer(f))
        return h.digest()

    def sign(self, frames: list) -> list:
        return frames + [self.digest(frames)] if self.enabled else frames

    def verify(self, frames: list) -> list:
        """The frames without the digest; raises ProtocolError when it does not match."""
        if not self.enabled:
            return frames
        if len(frames) < 2 or len(_buffer(frames[-1])) != DIGEST_BYTES:
            raise ProtocolError("unsigned message, but this process has PARAMSHARD_SECRET set: "
                                "set the same secret on every process of the job")
        if not hmac.compare_digest(self.digest(frames[:-1]), bytes(_buffer(frames[-1]))):
            raise ProtocolError("message authentication failed: PARAMSHARD_SECRET differs between "
                                "processes, or the message was altered")
        return frames[:-1]

    def check_header(self, header: dict) -> None:
        if header.get("signed") and not self.enabled:
            raise ProtocolError("signed message, but this process has no PARAMSHARD_SECRET: "
                                "set the same secret on every process of the job")
