#!/usr/bin/env bash
# Builds recfleet's libFuzzer targets with clang (ASan + UBSan) and runs each
# for a bounded time on its committed corpus; fails on any crash, leak,
# sanitizer report or timeout, printing the input that caused it.
#
#   fuzz/run_fuzzers.sh [SECONDS_PER_TARGET (default 20)] [TARGET...]
#
# Runs from the repository root or as the Bazel test //fuzz:fuzz_test (the
# generated protobuf sources come from the build then; outside Bazel,
# bazel-bin must hold them: `bazel build //proto:job_proto`). Targets:
# rfd_reader (data/dataset_file), ingest (data/ingest), spec_file
# (cli/jobs/spec_file). A crash input saved under fuzz/corpus/TARGET/
# becomes a regression case every later run replays.
set -euo pipefail

seconds=${1:-20}
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(rfd_reader ingest spec_file)

if [[ -n ${TEST_SRCDIR:-} ]]; then
  root=$PWD  # The runfiles tree: sources and generated protos side by side.
  gen=$root/proto
else
  root=$(cd "$(dirname "$0")/.." && pwd)
  gen=$root/bazel-bin/proto
fi
cd "$root"
work=${TEST_TMPDIR:-$(mktemp -d)}/fuzz
mkdir -p "$work/obj"
cxx=$(command -v clang++-14 || command -v clang++ || true)
[[ -n $cxx ]] || { echo "run_fuzzers.sh: clang++ not found (tools/setup.sh installs clang-14)" >&2; exit 1; }
[[ -f $gen/recfleet/v1/job.pb.cc ]] || { echo "run_fuzzers.sh: no $gen/recfleet/v1/job.pb.cc" >&2; exit 1; }

# Instrumented: the code under test. Not instrumented: generated protobuf
# code (big, and not what is being tested).
sanitize=(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined)
common=(-std=c++17 -O1 -g -w -I"$root" -I"$gen" -I"$root/proto")
compile() {  # SRC OBJ [extra flags...]
  local src=$1 obj=$2
  shift 2
  "$cxx" "${common[@]}" "$@" -c "$src" -o "$obj"
}

t0=$(date +%s)
pids=()
for src in data/dataset_file.cc data/batch.cc data/schema.cc data/crc32c.cc data/ingest.cc \
           data/int_codec.cc data/sequences.cc \
           cli/jobs/spec_file.cc; do
  compile "$src" "$work/obj/$(basename "$src" .cc).o" "${sanitize[@]}" & pids+=($!)
done
compile "$gen/recfleet/v1/job.pb.cc" "$work/obj/job.pb.o" & pids+=($!)
for t in "${targets[@]}"; do
  compile "fuzz/${t}_fuzzer.cc" "$work/obj/${t}_fuzzer.o" "${sanitize[@]}" & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done

format=("$work/obj/dataset_file.o" "$work/obj/batch.o" "$work/obj/schema.o" "$work/obj/crc32c.o"
        "$work/obj/int_codec.o" "$work/obj/sequences.o")
absl_libs=$(pkg-config --libs absl_statusor absl_status absl_strings absl_str_format \
            absl_flat_hash_map absl_hash absl_random_random)
for t in "${targets[@]}"; do
  case $t in
    rfd_reader) objs=("${format[@]}") libs="" ;;
    ingest) objs=("$work/obj/ingest.o" "${format[@]}") libs="" ;;
    spec_file) objs=("$work/obj/spec_file.o" "$work/obj/job.pb.o") libs="-lprotobuf -lyaml-cpp" ;;
    *) echo "run_fuzzers.sh: unknown target $t" >&2; exit 2 ;;
  esac
  # shellcheck disable=SC2086
  "$cxx" -fsanitize=fuzzer,address,undefined "$work/obj/${t}_fuzzer.o" "${objs[@]}" \
    $libs $absl_libs -o "$work/${t}_fuzzer"
done
echo "run_fuzzers.sh: built ${targets[*]} in $(($(date +%s) - t0)) s"

status=0
for t in "${targets[@]}"; do
  # New inputs go to a scratch corpus; the committed one is only read.
  mkdir -p "$work/corpus-$t" "$work/artifacts-$t"
  export TMPDIR=$work
  if ! "$work/${t}_fuzzer" -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
       -print_final_stats=1 -artifact_prefix="$work/artifacts-$t/" \
       "$work/corpus-$t" "fuzz/corpus/$t" >"$work/$t.log" 2>&1; then
    echo "run_fuzzers.sh: $t FAILED; the end of its log:" >&2
    tail -60 "$work/$t.log" >&2
    for a in "$work/artifacts-$t"/*; do
      [[ -f $a ]] || continue
      echo "input $(basename "$a") (base64; save it under fuzz/corpus/$t/ to replay it):" >&2
      base64 -w0 "$a" >&2
      echo >&2
    done
    status=1
  else
    echo "run_fuzzers.sh: $t ok: $(grep -E '^stat::number_of_executed_units' "$work/$t.log" | awk '{print $2}') runs in ${seconds} s, corpus $(ls "fuzz/corpus/$t" | wc -l) seeds + $(ls "$work/corpus-$t" | wc -l) new"
  fi
done
exit $status
