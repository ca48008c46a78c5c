"""The commands about a user's data: dataset, gen-data, split-data, schema."""
