"""Where parameters live: dense blocks split and placed on servers (sharding), sparse ids
routed by a deterministic hash (sparse_hash), row helpers shared by trainers and servers (rows)."""
