"""What starts a job's processes: this machine, SSH, Kubernetes, the fork server."""
