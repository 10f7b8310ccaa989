#!/usr/bin/env bash
# End-to-end benchmark: recfleet's engine and the same GEM-lite in PyTorch
# (eager and torch.compile) on the same batches of config_a.yaml
# (attention-heavy) and config_b.yaml (dense-heavy), in one run.
#
#   bench/e2e/run.sh stage DIR    # build machine: build make_batches (and
#                                 # engine_bench, model_cuda_test) with
#                                 # --config=device; copy them, their
#                                 # non-system shared libs, the Python files
#                                 # and the job specs into DIR (about 84 MB,
#                                 # 25 MB as a .tgz: pack it to carry it)
#   bench/e2e/run.sh run DIR OUT  # GPU machine: per config, make_batches ->
#                                 # batches.bin + model.json in a scratch dir,
#                                 # bench_torch.py per mode, then engine_bench;
#                                 # JSON results and run.log in OUT
#
# Knobs (environment, defaults in brackets): E2E_CONFIGS [a b],
# E2E_BATCH_A [64], E2E_BATCH_B [1024], E2E_NUM_BATCHES [8] (batches in the
# file; steps cycle over them), E2E_STEPS [20], E2E_WARMUP [5],
# E2E_PROFILE_STEPS [3], E2E_MODES [eager compile], E2E_SEARCH_S [60]
# (largest-batch search per config, eager only; 0 skips it),
# E2E_TIMEOUT_S [600] (per Python process), E2E_SCRATCH [$TMPDIR/e2e],
# E2E_DEVICE [cuda] (cpu: a slow dry run of the Python side).
#
# The GPU machine must provide python3 with PyTorch (varlen_attn needs
# PyTorch >= 2.10) and numpy.
set -euo pipefail
cmd="${1:?stage|run}"
dir="${2:?artifact directory}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "$cmd" in
  stage)
    # The engine's side of the benchmark and its GPU correctness test
    # (engine/model_cuda_test, run before the benchmark), once they exist.
    targets=(//bench/e2e:make_batches)
    for t in //bench/e2e:engine_bench //engine:model_cuda_test; do
      if bazel query "$t" >/dev/null 2>&1; then targets+=("$t"); fi
    done
    bazel build --config=device "${targets[@]}"
    mkdir -p "$dir/lib"
    for t in "${targets[@]}"; do
      p="${t#//}"
      install -m 755 "bazel-bin/${p%%:*}/${t##*:}" "$dir/"
    done
    install -m 644 "$here"/gemlite_torch.py "$here"/bench_torch.py "$here"/config_a.yaml \
      "$here"/config_b.yaml "$dir/"
    install -m 755 "$here"/run.sh "$dir/"
    # System libraries of the build machine (Abseil, protobuf, yaml-cpp,
    # gRPC, ...) travel along; what every Linux with python3 has (the C
    # library, the compiler runtime, OpenSSL, zlib) and CUDA's libraries (the
    # GPU machine has its own cuBLAS) stay.
    for t in "${targets[@]}"; do ldd "$dir/${t##*:}"; done |
      awk '$3 ~ /^\// {print $3}' |
      grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libgcc_s|libstdc\+\+|libcu[A-Za-z]*|libnccl|libnvidia[^/]*|libssl|libcrypto|libz)\.so' |
      sort -u | xargs -r -I{} cp -L {} "$dir/lib/"
    du -sh "$dir"
    ;;
  run)
    out="${3:?output directory}"
    mkdir -p "$out"
    scratch="${E2E_SCRATCH:-${TMPDIR:-/tmp}/e2e}"
    export PYTHONUNBUFFERED=1
    log="$out/run.log"
    # The C++ binaries link cuBLAS: the CUDA toolkit's or the Python package's.
    cublas="$(find /usr /opt -name 'libcublasLt.so.13' 2>/dev/null | head -1)"
    # CUPTI (engine_bench's GPU idle measurement), from the toolkit or a
    # Python package; without it the measurement is skipped.
    cupti="$(find /usr /opt -name 'libcupti.so.13' 2>/dev/null | head -1)"
    libs="$dir/lib:$(dirname "${cublas:-/}")${cupti:+:$(dirname "$cupti")}"
    nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv 2>&1 | tee -a "$log" || true
    python3 -c 'import torch; print("torch", torch.__version__)' 2>&1 | tee -a "$log" || true
    status=0
    for cfg in ${E2E_CONFIGS:-a b}; do
      case "$cfg" in a) bs="${E2E_BATCH_A:-64}" ;; b) bs="${E2E_BATCH_B:-1024}" ;; *) bs=64 ;; esac
      work="$scratch/$cfg"
      mkdir -p "$work"
      LD_LIBRARY_PATH="$libs" "$dir/make_batches" --job "$dir/config_$cfg.yaml" --batch-size "$bs" \
        --batches "${E2E_NUM_BATCHES:-8}" --seed 1 --out "$work" 2>&1 | tee -a "$log"
      for mode in ${E2E_MODES:-eager compile}; do
        search=0
        if [ "$mode" = eager ]; then search="${E2E_SEARCH_S:-60}"; fi
        echo "== config $cfg, torch $mode, batch $bs" | tee -a "$log"
        timeout "${E2E_TIMEOUT_S:-600}" python3 "$dir/bench_torch.py" --model "$work/model.json" \
          --batches "$work/batches.bin" --mode "$mode" --steps "${E2E_STEPS:-20}" \
          --warmup "${E2E_WARMUP:-5}" --profile-steps "${E2E_PROFILE_STEPS:-3}" --search-s "$search" \
          --device "${E2E_DEVICE:-cuda}" --label "config_$cfg" --json "$out/torch_${cfg}_${mode}.json" >> "$log" 2>&1 || {
          echo "torch $mode on config $cfg failed (exit $?); see run.log" | tee -a "$log"; status=1; }
      done
      # ---- engine hook -------------------------------------------------------
      # The engine's benchmark reads the same batches (bench/e2e/batch_file.h,
      # ReadBatchFile) and writes its JSON beside the PyTorch ones.
      if [ -x "$dir/engine_bench" ]; then
        echo "== config $cfg, engine" | tee -a "$log"
        LD_LIBRARY_PATH="$libs" timeout "${E2E_TIMEOUT_S:-600}" "$dir/engine_bench" \
          --job "$dir/config_$cfg.yaml" --batches "$work/batches.bin" --json "$out/engine_$cfg.json" \
          --steps "${E2E_STEPS:-20}" --warmup "${E2E_WARMUP:-5}" \
          --profile-steps "${E2E_PROFILE_STEPS:-3}" --search-s "${E2E_SEARCH_S:-60}" \
          >> "$log" 2>&1 || { echo "engine_bench on config $cfg failed; see run.log" | tee -a "$log"; status=1; }
      else
        echo "== config $cfg, engine: engine_bench not staged, engine side not run" | tee -a "$log"
      fi
      # ---- end of engine hook ------------------------------------------------
      rm -rf "$work"
    done
    # One line per result.
    python3 - "$out" <<'PY' 2>&1 | tee -a "$log"
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    r = json.load(open(path))
    if not r.get("ok", True):
        print(f"{os.path.basename(path)}: FAILED {r.get('error', '')[:300]}")
        continue
    # The PyTorch side's keys, else engine_bench's.
    mb = r.get("max_batch") or {}
    median = r.get("step_ms", {}).get("median", r.get("median_step_ms"))
    peak = r.get("peak_memory_gib")
    if peak is None and r.get("peak_memory_bytes") is not None:
        peak = round(r["peak_memory_bytes"] / 2**30, 2)
    gi = r.get("gpu_idle") or {}
    idle = gi.get("idle_fraction")
    if idle is not None and gi.get("host_issue_ms_per_step") is not None:
        idle = (f"{idle} (host per step: issue {gi['host_issue_ms_per_step']} ms, "
                f"wait {gi['host_wait_ms_per_step']} ms)")
    print(f"{os.path.basename(path)}: batch {r.get('batch_size')} samples/s {r.get('samples_per_s')} "
          f"median step {median} ms  {r.get('tflops')} TFLOP/s "
          f"MFU {r.get('mfu_vs_989', r.get('mfu_989'))} "
          f"(vs 790: {r.get('mfu_vs_790_measured_gemm', r.get('mfu_790'))}) "
          f"peak {peak} GiB  max batch {mb.get('largest_fitting', r.get('largest_batch_fitting'))}  "
          f"first step {r.get('first_step_s')} s" + (f"  GPU idle {idle}" if idle is not None else ""))
PY
    exit $status
    ;;
  *) echo "usage: $0 stage DIR | run DIR OUT" >&2; exit 2 ;;
esac
