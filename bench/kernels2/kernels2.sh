#!/usr/bin/env bash
# GPU tests and benchmarks of kernels/{embedding,norm,quant,gemm} in one go.
#
#   bench/kernels2/kernels2.sh stage DIR   # on the build machine: build with
#                                          # --config=device, copy binaries,
#                                          # the C ABI .so, bench.py and the
#                                          # non-system shared libs into DIR
#   bench/kernels2/kernels2.sh run DIR OUT [BASE_SO]
#       on the GPU machine: run the gpu tests, then bench.py; logs in OUT.
#       With BASE_SO (another build's librecfleet_kernels2.so, e.g. main's),
#       bench.py runs base, new, base, new in separate processes over the
#       sections in $SECTIONS (default embedding_bf16,quantize,linear), so
#       every ratio has a baseline from the same run.
#
# The GPU machine must provide libcublasLt.so.13 (CUDA 13 toolkit or the
# nvidia-cublas Python package) and python3 with PyTorch.
set -euo pipefail
cmd="${1:?stage|run}"
dir="${2:?artifact directory}"
tests=(kernels/embedding:embedding_cuda_test kernels/norm:norm_cuda_test
       kernels/quant:quantize_cuda_test kernels/gemm:linear_cuda_test)
case "$cmd" in
  stage)
    labels=()
    for t in "${tests[@]}"; do labels+=("//$t"); done
    bazel build --config=device "${labels[@]}" //bench/kernels2:librecfleet_kernels2.so
    mkdir -p "$dir/lib"
    for t in "${tests[@]}"; do install -m 755 "bazel-bin/${t/://}" "$dir/"; done
    install -m 755 bazel-bin/bench/kernels2/librecfleet_kernels2.so bench/kernels2/bench.py \
      bench/kernels2/kernels2.sh "$dir/"
    # Abseil comes from the build machine's system as shared libraries.
    ldd "$dir"/*_test "$dir/librecfleet_kernels2.so" | awk '/libabsl/ {print $3}' | sort -u |
      xargs -r -I{} cp -L {} "$dir/lib/"
    ;;
  run)
    out="${3:?output directory}"
    cublas="$(find /usr /opt -name 'libcublasLt.so.13' 2>/dev/null | head -1)"
    export LD_LIBRARY_PATH="$dir/lib:$(dirname "${cublas:-/}"):${LD_LIBRARY_PATH:-}"
    nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv > "$out/gpu.txt"
    status=0
    for t in "${tests[@]}"; do
      name="${t#*:}"
      if "$dir/$name" > "$out/$name.log" 2>&1; then echo "PASS $name"; else echo "FAIL $name"; status=1; fi
      grep -E '^\[  (FAILED|PASSED) |Failure|error' "$out/$name.log" | head -20 || true
    done
    base="${4:-}"
    if [[ -z "$base" ]]; then
      PYTHONUNBUFFERED=1 python3 "$dir/bench.py" --lib "$dir/librecfleet_kernels2.so" \
        --json "$out/bench.json" 2>&1 | tee "$out/bench.log"
      exit $status
    fi
    for round in 1 2; do
      for which in base new; do
        lib="$dir/librecfleet_kernels2.so"
        [[ "$which" == base ]] && lib="$base"
        PYTHONUNBUFFERED=1 python3 "$dir/bench.py" --lib "$lib" \
          --sections "${SECTIONS:-embedding_bf16,quantize,linear}" \
          --json "$out/bench_${which}_${round}.json" 2>&1 | sed "s/^/[$which $round] /" |
          tee -a "$out/bench.log"
      done
    done
    exit $status
    ;;
  *) echo "usage: $0 stage DIR | run DIR OUT [BASE_SO]" >&2; exit 2 ;;
esac
