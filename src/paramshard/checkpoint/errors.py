"""The one error a checkpoint reader raises (its own module: every checkpoint module
raises it, and paramshard.checkpoint.format re-exports it where callers import it)."""
from __future__ import annotations

from paramshard.errors import ConfigError


class CheckpointError(ConfigError):
    """A checkpoint is missing, incomplete, does not match its manifest, or holds
    something a reader refuses (a path out of the checkpoint, a size no file holds)."""
