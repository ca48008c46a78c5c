"""`paramshard report`: plots, tables and the index.html of a run directory."""
