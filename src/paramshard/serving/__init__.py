"""Serving a model while it learns: a replica that follows a training job's delta directory
(paramshard.online) and answers predictions over HTTP (`paramshard serve`).

live_table.py: one copy of a table's rows in the servers' row stores; versions.py: two copies
and the version switch, so a delta is applied without pausing lookups; follow.py: which files
of the delta directory come next (exactly once, in order); replica.py: the model, its tables and
dense parameters, following the directory; http.py: the HTTP front; metrics.py: /metrics.
"""
