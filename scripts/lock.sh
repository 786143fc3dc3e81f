#!/usr/bin/env bash
# Re-resolves requirements.txt (exact direct pins) into requirements.lock (the whole tree).
#
# pyspark-client is left out on purpose: the Spark provider requires it (for Spark Connect, which Shoal does not
# use), but it ships the same `pyspark` package files as pyspark itself at an older version (4.2.0 beside 4.3.0),
# and two distributions writing one package give a half-upgraded pyspark. bootstrap.sh installs the lock with
# --no-deps, so the omission sticks.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
uv pip compile requirements.txt --python-version 3.11 --no-header --quiet \
  --no-emit-package pyspark-client -o requirements.lock
