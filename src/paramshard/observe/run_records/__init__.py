"""The run directory and the metric records in it, as written and as read back."""
