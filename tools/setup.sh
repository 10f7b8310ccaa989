#!/usr/bin/env bash
# Installs every build and test dependency of recfleet, pinned, from Debian's
# packages. Safe to run any number of times: packages already present at the
# pinned version are left alone and nothing is downloaded then.
#
# The CUDA toolkit (nvcc, cuBLASLt, NCCL headers) is expected on the machine;
# set CUDA_PATH if nvcc is not on PATH.
set -euo pipefail

PINNED=(
  bazel-bootstrap=4.2.3+ds-9
  protobuf-compiler=3.21.12-3+deb12u1
  libprotobuf-dev=3.21.12-3+deb12u1
  protobuf-compiler-grpc=1.51.1-3+b1
  libgrpc++-dev=1.51.1-3+b1
  libabsl-dev=20220623.1-1+deb12u2
  libgtest-dev=1.12.1-0.2
  libgmock-dev=1.12.1-0.2
  libbenchmark-dev=1.7.1-1
  libsqlite3-dev=3.40.1-2+deb12u2
  libgloo-dev=0.0~git20220518.5b14351-3
  libyaml-cpp-dev=0.7.0+dfsg-8+b1
  # Prometheus metrics (prometheus-cpp's core: families, the text format)
  # and the HTTP server and client of /metrics and /healthz (cpp-httplib).
  prometheus-cpp-dev=1.0.1-1
  libcpp-httplib-dev=0.11.4+ds-1+deb12u1
  # The daemons' logs (levels, UTC timestamps).
  libspdlog-dev=1:1.10.0+ds-0.4
  # deploy/tls/make-certs.sh (TLS tests and test clusters).
  openssl=3.0.22-1~deb12u2
  # tests/e2e:multi_host_test: network namespaces, veth pairs and a bridge.
  iproute2=6.1.0-3
  # fuzz/run_fuzzers.sh: clang with libFuzzer and the sanitizers; pkg-config
  # for the system libraries' link flags.
  clang-14=1:14.0.6-12
  libclang-rt-14-dev=1:14.0.6-12
  pkg-config=1.8.1-1
  # promtool, for //deploy/prometheus:rules_test (`promtool test rules`), and
  # the Prometheus server //tests/e2e:prometheus_test scrapes a local cluster with
  # (deploy/local/cluster.sh --prometheus).
  prometheus=2.42.0+ds-5+deb12u1
  # //cli:plan_html_render_test: headless Chromium renders `recfleet plan --html`.
  chromium-headless-shell=156.0.8078.114-1~deb12u1
  # The Python client (python/): Debian's CPython 3.11 and its venv module.
  python3=3.11.2-1+b1
  python3-venv=3.11.2-1+b1
  python3-pip=23.0.1+dfsg-1
)

missing=()
for spec in "${PINNED[@]}"; do
  pkg=${spec%%=*}
  want=${spec#*=}
  have=$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null || true)
  [[ "$have" == "$want" ]] || missing+=("$spec")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  if ! $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
    # A Debian point release may have replaced a pinned revision; take the
    # archive's current one rather than leaving the machine unusable.
    echo "setup: WARNING: pinned versions unavailable, installing the archive's current ones" >&2
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]%%=*}"
  fi
fi

# The Python client's pinned packages (python/requirements.lock), from PyPI:
# the wheels into .whl/ (so `pip install --no-index --find-links .whl
# ./python` works offline) and a virtual environment .venv/ holding them,
# which //tests/python:client_test builds and tests the package with. Both are
# redone only when the lock file changes.
repo=$(cd "$(dirname "$0")/.." && pwd)
lock="$repo/python/requirements.lock"
if ! cmp -s "$lock" "$repo/.whl/requirements.lock"; then
  echo "setup: downloading the Python client's pinned wheels into .whl/"
  rm -rf "$repo/.whl"
  mkdir -p "$repo/.whl"
  /usr/bin/python3 -m pip download --quiet --only-binary=:all: --no-deps \
    --dest "$repo/.whl" -r "$lock"
  cp "$lock" "$repo/.whl/requirements.lock"
fi
if ! cmp -s "$lock" "$repo/.venv/requirements.lock"; then
  echo "setup: making .venv/ with the Python client's pinned packages"
  rm -rf "$repo/.venv"
  /usr/bin/python3 -m venv "$repo/.venv"
  "$repo/.venv/bin/python" -m pip install --quiet --no-index --find-links "$repo/.whl" \
    -r "$lock"
  cp "$lock" "$repo/.venv/requirements.lock"
fi

# CUTLASS/CuTe headers, whose wgmma atoms the Hopper attention kernels use
# (kernels/attention/cuda_wgmma.cuh): the nvidia-cutlass wheel from PyPI, pinned by version and
# hash, of which only the C++ include/ tree is unpacked into .deps/cutlass/
# (git-ignored). The @cutlass repository
# (tools/build/cutlass_configure.bzl) points Bazel at it; the build itself
# downloads nothing. Redone only when the pin changes.
CUTLASS_VERSION=4.2.0.0
CUTLASS_SHA256=f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
cutlass="$repo/.deps/cutlass"
if [[ "$(cat "$cutlass/VERSION" 2>/dev/null)" != "$CUTLASS_VERSION $CUTLASS_SHA256" ]]; then
  echo "setup: unpacking the CUTLASS $CUTLASS_VERSION headers into .deps/cutlass/"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  /usr/bin/python3 -m pip download --quiet --only-binary=:all: --no-deps --dest "$tmp" \
    "nvidia-cutlass==$CUTLASS_VERSION"
  rm -rf "$cutlass"
  /usr/bin/python3 - "$tmp"/nvidia_cutlass-"$CUTLASS_VERSION"-*.whl "$CUTLASS_SHA256" \
    "$cutlass/include" <<'PY'
import hashlib, os, sys, zipfile
wheel, sha, dest = sys.argv[1:]
if hashlib.sha256(open(wheel, "rb").read()).hexdigest() != sha:
    sys.exit(f"setup: ERROR: {os.path.basename(wheel)} does not match its pinned sha256")
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            path = os.path.join(dest, name[len(prefix):])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(z.read(name))
PY
  echo "$CUTLASS_VERSION $CUTLASS_SHA256" > "$cutlass/VERSION"
  rm -rf "$tmp"
  trap - EXIT
fi

command -v nvcc >/dev/null || [[ -x "${CUDA_PATH:-/usr/local/cuda}/bin/nvcc" ]] || {
  echo "setup: ERROR: the CUDA toolkit (nvcc) is required to build kernels/; install CUDA 13 or set CUDA_PATH" >&2
  exit 1
}
echo "setup: all dependencies present"
