#!/usr/bin/env bash
# //tests/python:client_test and :checkpoint_test: builds and installs the
# recfleet package the way `pip install ./python` does (setup.py generating the
# gRPC stubs from proto/ with grpcio-tools), into a scratch folder, and runs
# the unittest file named by $1 (default client_test.py) against the binaries.
# Offline: the pinned packages come from the repository's .venv/, which
# tools/setup.sh makes from python/requirements.lock.
set -euo pipefail
test_py=${1:-client_test.py}

runfiles="$TEST_SRCDIR/$TEST_WORKSPACE"
# The runfiles are links into the source tree; .venv/ sits at its root.
repo=$(dirname "$(dirname "$(readlink -f "$runfiles/python/pyproject.toml")")")
python="$repo/.venv/bin/python"
if [[ ! -x $python ]] || ! cmp -s "$repo/python/requirements.lock" "$repo/.venv/requirements.lock"; then
  echo "client_test: $repo/.venv is missing or out of date; run tools/setup.sh" >&2
  exit 1
fi

# pip builds in the source folder, so build from a copy of python/ and proto/.
work="$TEST_TMPDIR/build"
mkdir -p "$work"
cp -RL "$runfiles/python" "$runfiles/proto" "$work/"
"$python" -m pip install --quiet --no-index --no-build-isolation --no-deps \
  --target "$work/site" "$work/python"

export RECFLEET_COORDINATOR_BIN="$runfiles/services/coordinator/recfleet-coordinator"
export RECFLEET_CLI_BIN="$runfiles/cli/recfleet"
export RECFLEET_MAKE_CERTS="$runfiles/deploy/tls/make-certs.sh"
export RECFLEET_DEMO_SPEC="$runfiles/deploy/examples/job-gemlite.yaml"
export RECFLEET_RFD_V1="$runfiles/fuzz/corpus/rfd_reader/synth-3-blocks.rfd"
export RECFLEET_CHECKPOINT_FIXTURE="$runfiles/tests/python/checkpoint_fixture"
cd "$work"
PYTHONPATH="$work/site" "$python" "$runfiles/tests/python/$test_py" -v 2>&1 |
  tee "$work/unittest.log"
