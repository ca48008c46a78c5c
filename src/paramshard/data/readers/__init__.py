"""Reading files: CSV/TSV/Parquet tables, Criteo, libsvm/libffm, byte ranges."""
