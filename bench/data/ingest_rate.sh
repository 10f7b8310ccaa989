#!/usr/bin/env bash
# Ingest rate of two builds of recfleet on the same event log, run
# alternately: events per CPU-second (user + system) of the whole
# `recfleet data ingest` process, and of data::Ingest alone (ingest_bench,
# which leaves out process start-up). CPU time, because the machine may be
# shared; wall seconds are printed too.
# Usage: bench/data/ingest_rate.sh OLD_BIN NEW_BIN LOG [RUNS (default 3; needed before flags)]
#          [INGEST FLAGS...]
#   OLD_BIN, NEW_BIN: folders holding `recfleet` and `ingest_bench`
#   LOG: an event log, e.g. bench/data/ml1m_shaped_log.py's output
# Writes scratch data under ${TMPDIR:-/tmp}/recfleet-bench-ingest (removed at the end).
set -euo pipefail
OLD=$1 NEW=$2 LOG=$3 RUNS=${4:-3}
shift 3; shift $(( $# > 0 ? 1 : 0 ))
WORK=${TMPDIR:-/tmp}/recfleet-bench-ingest
rm -rf "$WORK"; mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT
EVENTS=$(grep -cv '^[[:space:]]*$' "$LOG")
echo "## $(date -u +%FT%TZ) on $(hostname): $(nproc) cores,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "log: $LOG, $EVENTS non-blank lines, $(stat -c %s "$LOG") bytes; ingest flags: $*"
for run in $(seq "$RUNS"); do
  for build in old new; do
    bin=$OLD; [[ $build == new ]] && bin=$NEW
    /usr/bin/time -f "%U %S %e" -o "$WORK/time" \
      "$bin/recfleet" data ingest --input "$LOG" --out "$WORK/$build" "$@" >/dev/null
    read -r user sys wall <"$WORK/time"
    echo "run $run $build recfleet: $user s user + $sys s sys, $wall s wall:" \
      "$(awk -v e="$EVENTS" -v u="$user" -v s="$sys" 'BEGIN{printf "%.0f", e/(u+s)}') events per CPU-second"
  done
done
for build in old new; do
  bin=$OLD; [[ $build == new ]] && bin=$NEW
  echo "$build ingest_bench:"; "$bin/ingest_bench" --input "$LOG" --out "$WORK/$build" --repeats $((RUNS + 1)) "$@"
done
cmp "$WORK/old/train.rfd" "$WORK/new/train.rfd" && cmp "$WORK/old/sequences.rfs" "$WORK/new/sequences.rfs" &&
  echo "old and new wrote identical train.rfd and sequences.rfs"
