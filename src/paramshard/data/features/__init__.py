"""A table's schema and what becomes of each column: inference, fitting, encoding, hashing."""
