"""The Services a server runs (server/core/api.py): sparse, dense, checkpoints, barriers."""
