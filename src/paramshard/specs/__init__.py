"""Declarations checked when read, below every room that uses them: a table's schema (what its
columns become) and a model's spec (what was trained). Plain dataclasses and JSON: no pandas,
no torch, nothing imported or run from what a file says."""
