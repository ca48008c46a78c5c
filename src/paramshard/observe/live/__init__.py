"""Watching a job while it runs: progress lines, the server monitor, /metrics, TensorBoard."""
