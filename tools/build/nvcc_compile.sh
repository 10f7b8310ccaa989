#!/usr/bin/env bash
# Compiles one CUDA source for sm_90a into a position-independent object.
# Usage: nvcc_compile.sh NVCC OUT SRC [nvcc flags...]
set -euo pipefail
nvcc="$1"; out="$2"; src="$3"; shift 3
exec "$nvcc" -std=c++17 -O3 -Xcompiler -fPIC \
  -gencode=arch=compute_90a,code=sm_90a \
  --expt-relaxed-constexpr -lineinfo "$@" -c "$src" -o "$out"
