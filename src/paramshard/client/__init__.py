"""Trainer-side requests: dense blocks (dense.py) and sparse rows (sparse.py)."""
