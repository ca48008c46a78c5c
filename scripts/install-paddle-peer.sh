#!/usr/bin/env bash
# Install PaddlePaddle 3.0.0 (CPU) into its own venv, .venv-paddle at the repo root, for the
# "PaddlePaddle PS" candidates of benchmarks/ps_vs_pytorch.py (benchmarks/paddle_peer.py runs
# benchmarks/paddle_ps_ctr.py under .venv-paddle/bin/python).
#
# Its own venv, never the project's .venv: paddlepaddle pins numpy and protobuf versions of its own.
# The worker needs only paddle and numpy (the driver computes AUC / logloss from its probabilities). The wheel comes from PyPI, or from
# PADDLE_WHEELS (default /tmp/pdl) when that directory exists (a copy downloaded before).
# Idempotent: a venv whose python already imports paddle 3.0.0 is left as it is.
# CI does not need this: without .venv-paddle the benchmark skips the Paddle candidates and says why.
#
# Usage: scripts/install-paddle-peer.sh      (PYTHON=python3.11 by default: the cp311 wheel)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-paddle"
PYTHON="${PYTHON:-python3.11}"
WHEELS="${PADDLE_WHEELS:-/tmp/pdl}"
WANT="3.0.0"

if [ -x "$VENV/bin/python" ] && \
   [ "$("$VENV/bin/python" -c 'import paddle; print(paddle.__version__)' 2>/dev/null)" = "$WANT" ]; then
    echo "$VENV already has paddlepaddle $WANT"
    exit 0
fi
command -v "$PYTHON" >/dev/null || { echo "no $PYTHON: set PYTHON= to a Python 3.11 interpreter" >&2; exit 1; }
"$PYTHON" -m venv "$VENV"
FIND=()
if [ -d "$WHEELS" ]; then
    FIND=(--find-links "$WHEELS")
    echo "using wheels in $WHEELS first"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# protobuf < 6: paddle 3.0.0 requires only protobuf >= 3.20.2, but its fleet code reads
# FieldDescriptor.label, which newer protobuf releases dropped (DistributedStrategy().a_sync = True
# fails with "a_sync_configs is not a attribute of DistributedStrategy" under protobuf 7.36).
"$VENV/bin/python" -m pip install --quiet "${FIND[@]}" "paddlepaddle==$WANT" "protobuf>=3.20.2,<6" numpy
"$VENV/bin/python" -c 'import paddle; print("paddlepaddle", paddle.__version__, "in", paddle.__file__)'
