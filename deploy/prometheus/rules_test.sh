#!/usr/bin/env bash
# //deploy/prometheus:rules_test: `promtool check rules` on recfleet-rules.yml
# and `promtool test rules` on recfleet-rules_test.yml, whose input series are
# shaped like the exporters' output. promtool comes from Debian's prometheus
# package, which tools/setup.sh installs pinned.
set -euo pipefail

if ! command -v promtool >/dev/null 2>&1; then
  echo "rules_test: FAILED: promtool is not on PATH ($PATH)." >&2
  echo "rules_test: it ships in Debian's prometheus package; run tools/setup.sh." >&2
  exit 1
fi
dir="$TEST_SRCDIR/$TEST_WORKSPACE/deploy/prometheus"
# promtool resolves rule_files relative to the test file; copy both side by side.
work="$TEST_TMPDIR/rules"
mkdir -p "$work"
cp -L "$dir/recfleet-rules.yml" "$dir/recfleet-rules_test.yml" "$work/"
cd "$work"
promtool --version | head -1
promtool check rules recfleet-rules.yml
promtool test rules recfleet-rules_test.yml
