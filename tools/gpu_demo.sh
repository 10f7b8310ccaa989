#!/usr/bin/env bash
# The GPU demo: on a machine with a CUDA GPU, starts a local cluster (a
# coordinator, a data-loader and one GPU worker, `recfleet-worker --device
# cuda`, all on 127.0.0.1), trains configuration (a) of the engine benchmark
# (deploy/examples/job-gpu-config-a.yaml) on it, prints the worker's
# samples/s, local and E2E MFU and the /metrics addresses, then trains the
# same job with `recfleet train --local --device cuda` (the same step code in
# one process, no services) and prints both samples/s side by side.
#
#   tools/gpu_demo.sh                  build with Bazel here, then run
#   tools/gpu_demo.sh --bin DIR        run prebuilt binaries (recfleet,
#                                      recfleet-coordinator, recfleet-worker
#                                      in DIR; DIR/lib on LD_LIBRARY_PATH)
#   tools/gpu_demo.sh --stage DIR      build machine: build with
#                                      --config=device and copy the binaries,
#                                      their non-system shared libraries and
#                                      this script's inputs into DIR, for a
#                                      GPU machine without the build's
#                                      libraries (then: --bin DIR there)
#   --steps N   train N steps (default: the spec's 40)
#   --out DIR   keep the cluster's logs and the results there
#   --job FILE  another job spec (run as one worker)
#   --device cpu  a dry run of the same plumbing on CPU workers (use a small
#               --job, e.g. deploy/examples/job-gemlite.yaml)
#   --skip-local  leave out the `train --local` comparison run
#   --rates FILE  the rate table the coordinator predicts step time and peak
#               memory with (default: cluster.sh's, bench/rates/)
#
# The worker trains in bf16 (fp32 master weights); MFU is against 989
# TFLOP/s (dense bf16, H100/H200) and the first step is left out of both
# summaries (warm-up).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bin="" stage="" steps="" out="" job_file=deploy/examples/job-gpu-config-a.yaml device=cuda rates="" skip_local=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --bin) bin=$(cd "$2" && pwd); shift 2 ;;
    --stage) stage=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --job) job_file=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --skip-local) skip_local=1; shift ;;
    --rates) rates=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift 2 ;;
    -h | --help) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_demo: unknown argument $1 (see tools/gpu_demo.sh --help)" >&2; exit 2 ;;
  esac
done
targets=(//cli:recfleet //services/coordinator:recfleet-coordinator //worker:recfleet-worker)

if [[ -n $stage ]]; then
  bazel build --config=device "${targets[@]}"
  mkdir -p "$stage/lib"
  for t in "${targets[@]}"; do install -m 755 "bazel-bin/$(echo "${t#//}" | tr : /)" "$stage/"; done
  # As bench/e2e/run.sh stage: the build machine's libraries travel, except
  # what every Linux has and CUDA's own (the GPU machine has its driver's).
  for b in recfleet recfleet-coordinator recfleet-worker; do ldd "$stage/$b"; done |
    awk '$3 ~ /^\// {print $3}' |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libgcc_s|libstdc\+\+|libcu[A-Za-z]*|libnccl|libnvidia[^/]*|libssl|libcrypto|libz)\.so' |
    sort -u | xargs -r -I{} cp -L {} "$stage/lib/"
  du -sh "$stage"
  exit 0
fi

if [[ -z $bin ]]; then
  bazel build "${targets[@]}"
  b=$(bazel info bazel-bin 2>/dev/null)
  bin=$(mktemp -d "${TMPDIR:-/tmp}/recfleet-gpu-bin.XXXXXX")
  ln -s "$b/cli/recfleet" "$b/services/coordinator/recfleet-coordinator" "$b/worker/recfleet-worker" "$bin/"
fi
if [[ -d $bin/lib ]]; then
  # The C++ binaries link cuBLAS and NCCL: the CUDA toolkit's or a Python
  # package's.
  cublas=$(find /usr /opt -name 'libcublasLt.so.*' 2>/dev/null | head -1 || true)
  nccl=$(find /usr /opt -name 'libnccl.so.2*' 2>/dev/null | head -1 || true)
  export LD_LIBRARY_PATH="$bin/lib${cublas:+:$(dirname "$cublas")}${nccl:+:$(dirname "$nccl")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
recfleet=$bin/recfleet
work=${out:-$(mktemp -d "${TMPDIR:-/tmp}/recfleet-gpu-demo.XXXXXX")}
mkdir -p "$work"
cluster=$work/cluster
job_yaml=$work/job.yaml
cp "$job_file" "$job_yaml"
[[ -n $steps ]] && sed -i "s/^  steps: .*/  steps: $steps/" "$job_yaml"
# One worker; one GPU for it, or none on a CPU dry run.
gpus=1 cluster_flags=(--topology deploy/local/h200-topology.yaml --worker-flag --device=cuda)
[[ $device == cpu ]] && gpus=0 cluster_flags=()
[[ -n $rates ]] && cluster_flags+=(--step-rates "$rates")
sed -i -e "s/^  workers: .*/  workers: 1/" -e "s/^  gpus_per_worker: .*/  gpus_per_worker: $gpus/" "$job_yaml"
trap 'deploy/local/cluster.sh stop "$cluster" || true' EXIT
echo "demo directory: $work"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true

# A worker /metrics value by series name ("" when absent).
metric() {
  python3 - "$1" "$2" <<'PY' 2>/dev/null || true
import sys, urllib.request
text = urllib.request.urlopen("http://" + sys.argv[1] + "/metrics", timeout=5).read().decode()
for line in text.splitlines():
    if line.startswith(sys.argv[2] + " "):
        print(line.split()[1])
PY
}
# samples/s of a run's summary line (worker/rank_run.cc).
summary_rate() { sed -n 's/.*summary over [0-9]* steps after the first: \([0-9.]*\) samples\/s.*/\1/p' "$1" | tail -1; }

printf '\n== local cluster: coordinator, data-loader, one worker (%s)\n' "$device"
deploy/local/cluster.sh start "$cluster" --workers 1 --bin "$bin" --loader --lease 30 \
  ${cluster_flags[@]+"${cluster_flags[@]}"}
coordinator=$(cat "$cluster/coordinator.address")
worker_metrics=$(sed -n 's/^worker0 http:\/\/\([^/]*\)\/metrics.*/\1/p' "$cluster/metrics.txt")

printf '\n== submit %s\n' "$job_yaml"
start=$(date +%s.%N)
job=$("$recfleet" submit "$job_yaml" --coordinator "$coordinator" --json |
  sed -n 's/^ *"name": "\(jobs\/[^"]*\)".*/\1/p' | head -1)
echo "submitted $job"
state="" mfu="" e2e="" scaling="" qps=""
while true; do
  json=$("$recfleet" get "$job" --coordinator "$coordinator" --json)
  state=$(echo "$json" | sed -n 's/.*"state": "\([A-Z_]*\)".*/\1/p' | head -1)
  # Scrape the worker while it trains (its MFU series leave with the task).
  m=$(metric "$worker_metrics" recfleet_worker_mfu)
  if [[ -n $m ]]; then
    mfu=$m
    e2e=$(metric "$worker_metrics" recfleet_worker_e2e_mfu)
    scaling=$(metric "$worker_metrics" recfleet_worker_scaling_ratio)
    qps=$(metric "$worker_metrics" recfleet_worker_samples_per_second)
  fi
  case $state in SUCCEEDED | FAILED | CANCELLED) break ;; esac
  sleep 1
done
wall=$(python3 -c "import time; print(f'{time.time() - $start:.1f}')")
grep -E "trains on CUDA|summary over|eval at|Error|error" "$cluster/worker0.log" || true
worker_rate=$(summary_rate "$cluster/worker0.log")
"$recfleet" get "$job" --coordinator "$coordinator" || true

local_rate=""
if [[ $skip_local == 0 ]]; then
  printf '\n== the same job: recfleet train --local --device %s\n' "$device"
  "$recfleet" train --local "$job_yaml" --device "$device" --checkpoint-dir "$work/local-ckpt" \
    --log-every 10 >"$work/train-local.log" 2>&1 || { tail -20 "$work/train-local.log"; exit 1; }
  grep -E "summary over|AUC" "$work/train-local.log" || true
  local_rate=$(summary_rate "$work/train-local.log")
fi

printf '\n== result\n'
echo "job $job: $state in ${wall} s (submit to end, data generation and model set-up included)"
echo "worker, scraped from /metrics while training: samples/s ${qps:-n/a}, local MFU ${mfu:-n/a}," \
  "E2E MFU ${e2e:-n/a}, scaling ratio ${scaling:-n/a}"
echo "samples/s over the steps after the first: worker ${worker_rate:-n/a}," \
  "train --local ${local_rate:-n/a}"
# The last eval of each run: "AUC x NE y" (NE < 1: better than predicting
# the base rate of the held-out samples).
eval_of() { sed -n 's/.*eval at step \([0-9]*\): \(AUC [0-9.]* NE [0-9.]*\).*/\2 (step \1)/p' "$1" | tail -1; }
echo "held-out eval: worker $(eval_of "$cluster/worker0.log"), train --local $(eval_of "$work/train-local.log")" \
  "(NE < 1 = better than the base rate)"
if [[ -n $worker_rate && -n $local_rate ]]; then
  python3 -c "w, l = $worker_rate, $local_rate; print(f'worker / train --local: {w / l:.3f} (platform overhead {100 * (1 - w / l):.1f}%)')"
fi
sed 's/^/metrics: /' "$cluster/metrics.txt"
[[ $state == SUCCEEDED ]]
