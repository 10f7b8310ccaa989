#!/usr/bin/env bash
# Data-plane benchmarks: straggler gaps of the dealing policies and loader
# throughput. Usage: bench/data/run.sh [BIN_DIR] [REAL_DATA_DIR]
#   BIN_DIR: where recfleet, balance_bench and loader_bench are
#            (default: bazel-bin after building them here).
#   REAL_DATA_DIR: holds ml-100k/ (default: $RECFLEET_DATA_DIR); the
#            ml-100k part is skipped without it.
# Writes scratch data under ${TMPDIR:-/tmp}/recfleet-bench-data.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-}
REAL=${2:-${RECFLEET_DATA_DIR:-}}
if [[ -z "$BIN" ]]; then
  bazel build --jobs=2 //cli:recfleet //bench/data:balance_bench //bench/data:loader_bench \
    //bench/data:service_bench >&2
  BIN=bazel-bin
  RECFLEET=$BIN/cli/recfleet; BALANCE=$BIN/bench/data/balance_bench
  LOADER=$BIN/bench/data/loader_bench; SERVICE=$BIN/bench/data/service_bench
else
  RECFLEET=$BIN/recfleet; BALANCE=$BIN/balance_bench; LOADER=$BIN/loader_bench
  SERVICE=$BIN/service_bench
fi
WORK=${TMPDIR:-/tmp}/recfleet-bench-data
mkdir -p "$WORK"
echo "## $(date -u +%FT%TZ) on $(hostname): $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"

if [[ -n "$REAL" && -f "$REAL/ml-100k/ml-100k.inter" ]]; then
  echo; echo "### ml-100k samples (history capped at 1024), 8 ranks x batch 1024, 20 epochs pooled"
  "$RECFLEET" data ingest --input "$REAL/ml-100k/ml-100k.inter" --out "$WORK/ml100k" --max-history 1024
  for cost in linear quadratic; do
    "$RECFLEET" data balance-report --dataset "$WORK/ml100k" --ranks 8 --batch-size 1024 --cost $cost --epochs 20
  done
else
  echo "(ml-100k not found: set RECFLEET_DATA_DIR; skipping the real-data balance report)"
fi

echo; echo "### synthetic heavy-tailed lengths: log-normal mean 1000, sigma 1.2, clipped to [10, 50000]"
for cost in linear quadratic; do
  "$BALANCE" --lengths lognormal:mean=1000,sigma=1.2,min=10,max=50000 --samples 819200 --cost $cost
done

echo; echo "### loader throughput, mean length 1000 (synthetic, 40k samples), one thread"
"$RECFLEET" data synth --out "$WORK/heavy" --samples 40000 --items 1000000 \
  --lengths lognormal:mean=1000,sigma=1.2,min=10,max=50000
for cost in linear quadratic; do
  "$LOADER" --dataset "$WORK/heavy/train.rfd" --cost $cost --epochs 4
done
"$LOADER" --dataset "$WORK/heavy/train.rfd" --cost linear --epochs 4 --wire yes

echo; echo "### end to end over gRPC loopback: 8 client threads, one per rank"
"$SERVICE" --dataset "$WORK/heavy/train.rfd" --cost linear --epochs 2
