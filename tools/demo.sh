#!/usr/bin/env bash
# recfleet demo: builds the coordinator and CLI, starts a coordinator on
# loopback with a throw-away job database, submits the example GEM-lite job,
# watches it, cancels it, shows `list`/`get` and the /metrics endpoint, then
# stops everything. Run from anywhere: tools/demo.sh
# (RECFLEET_SKIP_SETUP=1 skips installing dependencies.)
set -euo pipefail
cd "$(dirname "$0")/.."

[[ "${RECFLEET_SKIP_SETUP:-0}" == 1 ]] || tools/setup.sh
bazel build //cli:recfleet //services/coordinator:recfleet-coordinator
bin="$(bazel info bazel-bin 2>/dev/null)"
recfleet="$bin/cli/recfleet"

tmp="$(mktemp -d)"
coordinator_pid=""
watch_pid=""
cleanup() {
  [[ -z "$watch_pid" ]] || kill "$watch_pid" 2>/dev/null || true
  if [[ -n "$coordinator_pid" ]]; then
    kill -TERM "$coordinator_pid" 2>/dev/null || true
    wait "$coordinator_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "start the coordinator on 127.0.0.1 (job database $tmp/jobs.db)"
"$bin/services/coordinator/recfleet-coordinator" --listen=127.0.0.1:0 --db="$tmp/jobs.db" \
  --metrics_address=127.0.0.1:0 --address_file="$tmp/address" >"$tmp/coordinator.log" 2>&1 &
coordinator_pid=$!
for _ in $(seq 100); do [[ -s "$tmp/address" ]] && break; sleep 0.1; done
[[ -s "$tmp/address" ]] || { cat "$tmp/coordinator.log"; echo "demo: coordinator did not start" >&2; exit 1; }
cat "$tmp/coordinator.log"
export RECFLEET_COORDINATOR="$(cat "$tmp/address")"
metrics="$(grep -o 'http://[^ ]*/metrics' "$tmp/coordinator.log")"

step "recfleet submit deploy/examples/job-gemlite.yaml"
out="$("$recfleet" submit deploy/examples/job-gemlite.yaml)"
echo "$out"
job="${out%% *}"

step "recfleet watch $job (in the background)"
"$recfleet" watch "$job" --progress &
watch_pid=$!
sleep 1

step "recfleet list"
"$recfleet" list

step "recfleet get $job"
"$recfleet" get "$job"
echo "(no worker daemons are running, so the job waits in QUEUED for 2 workers)"

step "recfleet cancel $job"
"$recfleet" cancel "$job" --reason "demo finished"
wait "$watch_pid" || true  # watch exits 1 for a job that did not succeed
watch_pid=""

step "recfleet list, and the same as JSON for scripts"
"$recfleet" list
"$recfleet" list --json >"$tmp/list.json"
head -n 8 "$tmp/list.json"
echo "  ..."

step "Prometheus metrics at $metrics"
if command -v curl >/dev/null; then
  curl -s "$metrics" | grep -E '^recfleet_(jobs|workers|jobs_created_total|job_transitions_total)' || true
else
  echo "(install curl to print them here)"
fi

step "stop the coordinator"
kill -TERM "$coordinator_pid"
wait "$coordinator_pid" || true
coordinator_pid=""
echo "demo finished"
