"""The server's core: the socket loop, its context, hooks, waiting answers, replies and peers."""
