"""The commands that start, run, watch and change jobs: launch, run, server, plan, env, stats,
scale, k8s, report."""
