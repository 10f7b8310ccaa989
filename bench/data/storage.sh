#!/usr/bin/env bash
# Histories by reference against histories inline: bytes on disk, ingest
# rate and loader rate of two builds of recfleet on the same event log.
# Usage: bench/data/storage.sh OLD_BIN NEW_BIN LOG [INGEST FLAGS...]
#   OLD_BIN, NEW_BIN: folders holding `recfleet` and `loader_bench`
#   LOG: an event log, e.g. bench/data/ml1m_shaped_log.py's output
# Writes scratch data under ${TMPDIR:-/tmp}/recfleet-bench-storage (removed at the end).
set -euo pipefail
OLD=$1 NEW=$2 LOG=$3
shift 3
WORK=${TMPDIR:-/tmp}/recfleet-bench-storage
rm -rf "$WORK"
mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT
echo "## $(date -u +%FT%TZ) on $(hostname): $(nproc) cores,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "log: $LOG, $(wc -l <"$LOG") lines, $(stat -c %s "$LOG") bytes; ingest flags: $*"
for build in old new; do
  bin=$OLD
  [[ $build == new ]] && bin=$NEW
  echo; echo "### $build ($bin)"
  # CPU seconds as well as wall: the machine may be shared.
  /usr/bin/time -f "ingest: %e s wall, %U s user, %S s sys, %M KiB max RSS" \
    "$bin/recfleet" data ingest --input "$LOG" --out "$WORK/$build" "$@"
  ls -l "$WORK/$build" | grep -E '\.(rfd|rfs)$'
  echo "bytes of .rfd + .rfs: $(cat "$WORK/$build"/*.rfd "$WORK/$build"/*.rfs 2>/dev/null | wc -c)"
  for cost in linear quadratic; do
    "$bin/loader_bench" --dataset "$WORK/$build/train.rfd" --cost $cost --epochs 3
  done
  rm -rf "${WORK:?}/$build"
done
