"""Live event streams a job trains on until it is stopped (paramshard.data.stream.source)."""
