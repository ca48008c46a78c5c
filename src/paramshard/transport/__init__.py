"""Wire protocol (DESIGN section 3, appendix A.2): msgpack headers, raw array frames, ZeroMQ sockets."""
