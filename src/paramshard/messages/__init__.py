"""What two rooms tell each other, as types: a server's stats reply, a server's status lines, a data-shard task."""
