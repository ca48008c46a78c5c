"""Wire protocol (DESIGN section 4): msgpack headers, raw array frames, ZeroMQ sockets."""
