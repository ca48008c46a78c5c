"""Online learning: what a training job publishes while it learns (deltas and snapshots of its
servers' rows and dense blocks) for serving replicas that follow it (paramshard.serving)."""
