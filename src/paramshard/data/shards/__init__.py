"""Which data each trainer reads: static shards, shard tasks, the dynamic loader, hold-outs."""
