"""Errors of live event sources (paramshard.data.stream)."""
from __future__ import annotations

from paramshard.errors import ConfigError


class PositionError(ConfigError):
    """A position given to ``seek`` is damaged, or belongs to another source, rank or world: it
    names the field at fault and says what to do. Nothing was moved."""
