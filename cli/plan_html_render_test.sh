#!/usr/bin/env bash
# //cli:plan_html_render_test: `recfleet plan --html` renders in a real
# browser. Headless Chromium (Debian's chromium-headless-shell, which
# tools/setup.sh installs pinned) loads the report, and the test checks the
# DOM it built (the sections, the SVG charts, the planner's decisions) and
# that the screenshot has content (a blank or broken page compresses to a
# few KB of PNG).
set -euo pipefail

browser=chromium-headless-shell
if ! command -v "$browser" >/dev/null 2>&1; then
  echo "plan_html_render_test: FAILED: $browser is not on PATH ($PATH)." >&2
  echo "plan_html_render_test: it is Debian's chromium-headless-shell; run tools/setup.sh." >&2
  exit 1
fi
root="$TEST_SRCDIR/$TEST_WORKSPACE"
work="$TEST_TMPDIR/render"
mkdir -p "$work"
"$root/cli/recfleet" plan "$root/deploy/examples/plan-model-gem-large.yaml" \
  --topology "$root/deploy/examples/topology-h200-2k.yaml" --html "$work/plan.html" > "$work/plan.txt"

# Root in CI containers: Chromium's own sandbox needs a user namespace; the
# page is our own local file.
flags=(--no-sandbox --disable-gpu --user-data-dir="$work/profile" --window-size=1280,2000)
"$browser" "${flags[@]}" --dump-dom "file://$work/plan.html" > "$work/dom.html" 2> "$work/browser.log"
"$browser" "${flags[@]}" --screenshot="$work/shot.png" "file://$work/plan.html" 2>> "$work/browser.log"

fail=0
expect() {
  if ! grep -qF -- "$1" "$work/dom.html"; then
    echo "plan_html_render_test: the rendered page lacks: $1" >&2
    fail=1
  fi
}
expect "gem-large on h200-2k"
expect "Step time"
expect "Per-GPU memory"
expect "Traffic per link level"
expect "Decisions"
expect "dense mesh (2D FSDP)"
expect "sparse layout (2D model parallelism)"
expect "<svg"
expect "<rect"
# The summary line of the text report and of the page agree on the predicted step.
step=$(grep -o 'Predicted step <b>[0-9.]* ms' "$work/dom.html" | head -1 | grep -o '[0-9][0-9.]*')
if [[ -z "$step" ]] || ! grep -qF "$step" "$work/plan.txt"; then
  echo "plan_html_render_test: predicted step '$step' of the page is not in the text report" >&2
  fail=1
fi
size=$(stat -c %s "$work/shot.png" 2>/dev/null || echo 0)
if (( size < 50000 )); then
  echo "plan_html_render_test: screenshot is $size bytes: the page rendered (nearly) blank" >&2
  fail=1
fi
if (( fail )); then
  echo "--- browser log ---" >&2
  tail -20 "$work/browser.log" >&2
  exit 1
fi
echo "plan_html_render_test: rendered; predicted step $step ms; screenshot $size bytes"
