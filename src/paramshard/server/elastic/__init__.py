"""Moving partitions and blocks between servers, bounded-loss replication, the data-shard queue."""
