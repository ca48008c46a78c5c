"""Changing a running job: the control channel, trainer and server scaling, replicas."""
