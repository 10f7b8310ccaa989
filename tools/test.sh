#!/usr/bin/env bash
# The test command: installs dependencies, builds everything (CUDA included)
# and runs every test not tagged `gpu`, `bench` or `manual`.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
bazel build //...
bazel test //... "$@"
