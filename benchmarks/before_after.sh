#!/bin/bash
# A redesign with no change in behaviour, checked on the CTR benchmark: ps_vs_pytorch.py from two
# trees (BEFORE: a worktree of the old commit, AFTER: this one), alternated round by round.
# usage: BEFORE=/path/to/old/worktree benchmarks/before_after.sh > out.txt
for round in 1 2 3; do
  for tree in before after; do
    if [ $tree = before ]; then T=${BEFORE:?set BEFORE to the old tree}; else T=$(cd "$(dirname "$0")/.." && pwd); fi
    echo "=== round $round $tree" 
    PYTHONPATH=$T/src timeout 900 "$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python" $T/benchmarks/ps_vs_pytorch.py --only "1s+1w async,2s+2w sync" --dists uniform --no-scaling --train-rows 100000 --test-rows 20000 --repeats 1 --markdown 2>/dev/null
  done
done
