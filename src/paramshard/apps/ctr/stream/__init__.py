"""The CTR app on a live stream (`--stream`, issue 33): options.py (what goes with --stream and
what is refused), run.py (predict then train until stopped), progressive.py (the window metric)."""
