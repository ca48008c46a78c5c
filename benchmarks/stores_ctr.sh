#!/bin/bash
# The CTR job of RESULTS section 9 with each row store: ps_vs_pytorch.py under PARAMSHARD_ROW_STORE=numpy and
# =compiled in turn (the launcher passes it to the servers), ROUNDS rounds alternated; ratios are to the
# PyTorch process of the same run.
# usage: benchmarks/stores_ctr.sh [ROUNDS] > out.txt
ROOT=$(cd "$(dirname "$0")/.." && pwd)
for round in $(seq 1 "${1:-2}"); do
  for store in numpy compiled; do
    echo "=== round $round store $store"
    PARAMSHARD_ROW_STORE=$store timeout 900 "$ROOT/.venv/bin/python" "$ROOT/benchmarks/ps_vs_pytorch.py" \
      --only "1s+1w async,2s+2w async" --dists uniform,zipf --no-scaling --train-rows 100000 --test-rows 20000 \
      --repeats 1 --markdown 2>/dev/null
  done
done
