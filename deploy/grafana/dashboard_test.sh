#!/usr/bin/env bash
# Runs dashboard_test.py with the exporters' sources as arguments.
set -euo pipefail
exec python3 "$TEST_SRCDIR/$TEST_WORKSPACE/deploy/grafana/dashboard_test.py" "$@"
