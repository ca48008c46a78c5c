"""One rank joining its job: its engine's world, rendezvous, the job secret, what it runs."""
