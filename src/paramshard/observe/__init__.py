"""Seeing a job: the run directory, metric records, live progress, plots, /metrics."""
