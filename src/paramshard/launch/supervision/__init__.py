"""Watching a job to its end: the launcher loop, restarts, how each rank ended."""
