#!/usr/bin/env bash
# The recfleet demo: sets up the machine, builds, prepares a dataset, starts
# a local cluster (coordinator, data-loader and two CPU worker daemons on
# 127.0.0.1), submits a GEM-lite job, streams its progress, and ends with
# the eval AUC and NE and the /metrics addresses.
#
#   tools/demo.sh                      synthetic data with a planted label model
#   tools/demo.sh --movielens DIR      a MovieLens-format folder instead
#                                      (DIR/NAME.inter [+ NAME.user, NAME.item])
#   tools/demo.sh --steps N --keep     train N steps; leave the cluster running
#
# Everything goes to a temporary directory (printed); nothing outside the
# repository's bazel-* folders is written. RECFLEET_SKIP_SETUP=1 skips
# installing dependencies.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

movielens=""
steps=""
keep=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --movielens) movielens=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo: unknown argument $1 (see tools/demo.sh --help)" >&2; exit 2 ;;
  esac
done
if [[ -n $movielens ]]; then
  movielens=$(cd "$movielens" && pwd) || { echo "demo: --movielens: no directory $movielens" >&2; exit 2; }
  name=$(basename "$movielens")
  [[ -f $movielens/$name.inter ]] || {
    echo "demo: --movielens: expected $movielens/$name.inter (tab-separated, header user_id:token item_id:token rating:float timestamp:float)" >&2
    exit 2
  }
fi

step() { printf '\n== %s\n' "$*"; }
start_time=$(date +%s)

if [[ "${RECFLEET_SKIP_SETUP:-0}" != 1 ]]; then
  step "setup (tools/setup.sh)"
  tools/setup.sh
fi

step "build"
bazel build --jobs=2 //cli:recfleet //services/coordinator:recfleet-coordinator //worker:recfleet-worker
bin=$(bazel info bazel-bin 2>/dev/null)
recfleet=$bin/cli/recfleet

tmp=$(mktemp -d "${TMPDIR:-/tmp}/recfleet-demo.XXXXXX")
cluster=$tmp/cluster
cleanup() {
  if [[ $keep == 1 ]]; then
    echo "cluster left running; stop it with: deploy/local/cluster.sh stop $cluster"
  else
    deploy/local/cluster.sh stop "$cluster" || true
  fi
}
trap cleanup EXIT
echo "demo directory: $tmp"

# Table rows for a column from the dataset's schema metadata.
rows() { "$recfleet" data info --dataset "$tmp/data/train.rfd" | sed -n "s/^# table\.$1\.rows = //p"; }

best_auc=""
if [[ -z $movielens ]]; then
  step "dataset: recfleet data synth"
  # 200k samples, so 1200 steps of 2 x 128 see each training sample about
  # twice (the model overfits a smaller set long before it learns the
  # planted model), and 500 users, each seen often enough to learn.
  out=$("$recfleet" data synth --out "$tmp/data" --samples 200000 --items 500 --users 500 --clusters 8 \
    --dense 4 --lengths "lognormal:mean=20,sigma=0.8,min=1,max=64" --eval-fraction 0.15 --seed 1)
  echo "$out"
  best_auc=$(echo "$out" | sed -n 's/.*AUC on eval: \([0-9.]*\).*/\1/p')
  : "${steps:=1200}"
  dense_lr=0.003 sparse_lr=0.1
  cat >"$tmp/job.yaml" <<EOF
display_name: demo-gemlite-synthetic
model:
  tables:
    - {name: item, rows: $(rows item), dim: 16}
    - {name: user, rows: $(rows user), dim: 16}
    - {name: item_category, rows: $(rows item_category), dim: 16}
  features:
    - {name: user_id, kind: ID_LIST, table: user}
    - {name: item_id, kind: CANDIDATE, table: item}
    - {name: item_category, kind: CANDIDATE, table: item_category}
    - {name: history_items, kind: SEQUENCE, table: item, max_length: 64}
    - {name: dense_0, kind: NUMERIC, width: 1}
    - {name: dense_1, kind: NUMERIC, width: 1}
    - {name: dense_2, kind: NUMERIC, width: 1}
    - {name: dense_3, kind: NUMERIC, width: 1}
  sequence: {features: [history_items], num_layers: 1, model_dim: 16, num_heads: 2, attention: {kind: FULL, rope: true}}
  cross: {num_cross_layers: 1, pma_queries: 2, num_heads: 2}
  dense:
    - dcn: {num_layers: 1}
    - moe: {num_experts: 2, top_k: 2, expert_hidden_dims: [64, 32]}
  heads:
    - {kind: CTR, label: label, hidden_dims: [16]}
EOF
else
  step "dataset: recfleet data ingest $movielens"
  side=()
  [[ -f $movielens/$name.user ]] && side+=(--user-features "$movielens/$name.user" --user-feature-columns age,gender,occupation)
  [[ -f $movielens/$name.item ]] && side+=(--item-features "$movielens/$name.item" --item-feature-columns release_year,class)
  "$recfleet" data ingest --input "$movielens/$name.inter" "${side[@]}" --label-threshold 4 \
    --split time --eval-fraction 0.2 --max-history 50 --out "$tmp/data"
  : "${steps:=600}"
  dense_lr=0.002 sparse_lr=0.05
  {
    cat <<EOF
display_name: demo-gemlite-$name
model:
  tables:
    - {name: item, rows: $(rows item), dim: 16}
    - {name: user, rows: $(rows user), dim: 16}
    - {name: action, rows: $(rows action), dim: 16}
    - {name: time_bucket, rows: $(rows time_bucket), dim: 16}
EOF
    for t in user_age user_gender user_occupation item_release_year item_class; do
      r=$(rows $t)
      [[ -n $r ]] && echo "    - {name: $t, rows: $r, dim: 16}"
    done
    echo "  features:"
    echo "    - {name: user_id, kind: ID_LIST, table: user}"
    echo "    - {name: item_id, kind: CANDIDATE, table: item}"
    for t in user_age user_gender user_occupation item_release_year; do
      [[ -n $(rows $t) ]] && echo "    - {name: $t, kind: ID_LIST, table: $t}"
    done
    [[ -n $(rows item_class) ]] && echo "    - {name: item_class, kind: ID_LIST, table: item_class, pooling: MEAN}"
    cat <<EOF
    - {name: history_items, kind: SEQUENCE, table: item, max_length: 50}
    - {name: history_actions, kind: SEQUENCE, table: action, max_length: 50}
    - {name: history_time_buckets, kind: SEQUENCE, table: time_bucket, max_length: 50}
  sequence: {features: [history_items, history_actions, history_time_buckets], num_layers: 1, model_dim: 16, num_heads: 2, attention: {kind: FULL, rope: true}}
  cross: {num_cross_layers: 1, pma_queries: 2, num_heads: 2}
  dense:
    - dcn: {num_layers: 1}
    - moe: {num_experts: 2, top_k: 2, expert_hidden_dims: [64, 32]}
  heads:
    - {kind: CTR, label: label, hidden_dims: [16]}
EOF
  } >"$tmp/job.yaml"
fi
cat >>"$tmp/job.yaml" <<EOF
data:
  dataset: $tmp/data
  local_batch_size: 128
  bbs: {enabled: true, cost_weights: {linear: 1}}
resources: {workers: 2}
training:
  steps: $steps
  eval_every: $((steps / 2))
  checkpoint_every: $((steps / 4))
  checkpoint_dir: $tmp/checkpoints
  dense_learning_rate: $dense_lr
  sparse_learning_rate: $sparse_lr
  seed: 1
EOF

step "local cluster: coordinator, data-loader and 2 CPU workers on 127.0.0.1"
deploy/local/cluster.sh start "$cluster" --workers 2 --bin "$bin" --loader --data-root "$tmp"
coordinator=$(cat "$cluster/coordinator.address")
export RECFLEET_COORDINATOR=$coordinator

step "submit $tmp/job.yaml and follow it"
job=$("$recfleet" submit "$tmp/job.yaml" --coordinator "$coordinator" --json | sed -n 's/^ *"name": "\(jobs\/[^"]*\)".*/\1/p' | head -1)
echo "submitted $job"
# Worker progress lines (loss, samples/s, step-time split) next to the
# coordinator's state changes.
tail -q -n0 -F "$cluster/worker0.log" 2>/dev/null | grep --line-buffered -E "step [0-9]+/|eval at|resumed" &
tail_pid=$!
"$recfleet" watch "$job" --coordinator "$coordinator" || true
kill "$tail_pid" 2>/dev/null || true

step "result"
"$recfleet" get "$job" --coordinator "$coordinator"
json=$("$recfleet" get "$job" --coordinator "$coordinator" --json)
field() { echo "$json" | sed -n "s/.*\"$1\": \"\{0,1\}\([A-Z0-9.e-]*\)\"\{0,1\},\{0,1\}$/\1/p" | head -1; }
state=$(field state)
auc=$(field eval_auc)
ne=$(field eval_ne)
echo
echo "job $job: $state after $(($(date +%s) - start_time)) s (setup and build included)"
echo "eval AUC ${auc:-n/a}  NE ${ne:-n/a}"
[[ -n $best_auc ]] && echo "best achievable AUC on this synthetic data (the planted model's): $best_auc"
sed 's/^/metrics: /' "$cluster/metrics.txt"
[[ $state == SUCCEEDED ]]
