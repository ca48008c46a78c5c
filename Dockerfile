# One image for every pod of a paramshard job on Kubernetes: servers and trainers run the
# same command (`paramshard run`, see `paramshard k8s`); the pod's environment picks the role.
#
#   docker build -t registry.example.com/paramshard:0.1.0 .
#
# Your own training script: build FROM this image and COPY it into /app (the WORKDIR);
# `paramshard k8s ... train.py` then names it relative to /app (docs/kubernetes.md).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# torch from the CPU-only index: the PyPI wheel for Linux pulls in gigabytes of CUDA libraries
# a CPU pod never loads. A layer of its own, first: it changes least often.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

# Not root: the job needs no privilege. The user owns /app so scripts can write
# their run directories (e.g. runs/) next to themselves. Its uid and gid, 10001, are the
# runAsUser/runAsGroup/fsGroup of every pod `paramshard k8s` renders (RUN_AS_ID in
# launch/engines/k8s.py): Pod Security "restricted" wants runAsNonRoot, which needs a numeric user.
RUN groupadd --gid 10001 paramshard \
    && useradd --create-home --uid 10001 --gid 10001 paramshard \
    && mkdir /app && chown 10001:10001 /app
WORKDIR /app

# The project and the examples' extras; the CPU torch above already satisfies torch==2.13.0
# (a local version label, +cpu, matches), so pip keeps it.
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install ".[examples]" && rm -rf build src/*.egg-info
COPY examples ./examples

USER 10001:10001
CMD ["paramshard", "--help"]
