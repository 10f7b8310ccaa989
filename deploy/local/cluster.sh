#!/usr/bin/env bash
# A local recfleet cluster on 127.0.0.1: one coordinator and N CPU worker
# daemons, plus a data-loader when --loader is given, every server on a port
# the OS picks, state and logs in one directory.
#
#   deploy/local/cluster.sh start DIR [--workers N] [--lease SECONDS] [--bin BINDIR]
#                                     [--loader] [--data-root DIR] [--topology FILE] [--tls]
#                                     [--worker-flag FLAG]... [--prometheus]
#                                     [--scrape-interval DURATION] [--step-rates FILE,...]
#   deploy/local/cluster.sh stop DIR
#
# --tls: every gRPC connection over TLS (certificates from
# deploy/tls/make-certs.sh in DIR/tls), the job API behind the users' token
# (DIR/token), workers registering with their own token (DIR/worker-token,
# which the loader requires too) and the loader serving a job's data only
# with the grant the coordinator signs (key DIR/data-grant-key); without it
# the cluster speaks plain text on loopback.
# The coordinator plans jobs with FILE's hardware numbers (a planner
# topology; default deploy/local/cpu-topology.yaml, a 2-core machine as
# measured by bench/planner/cpu_step_bench, which re-measures yours).
# The loader serves every job its own data: the dataset, ranks, batch sizes
# and BBS policy come from each job's spec (relative dataset paths from
# --data-root, default the directory the cluster was started from; a job
# naming a dataset outside it is refused when submitted); without
# a loader each worker reads and deals its job's data itself, the same way.
# `start` prints the coordinator address and the /metrics addresses, and
# writes them to DIR/coordinator.address and DIR/metrics.txt; the processes'
# ids go to DIR/pids (what `stop` signals) and their logs to DIR/*.log.
# Binaries come from --bin (default: the repository's bazel-bin).
# --step-rates: the engine's measured rate tables the coordinator predicts
# step time and peak memory with (`recfleet get` shows them beside the
# measured ones); default bench/rates/h200-bf16.yaml and the CPU table of
# bench/rates/cpu-fp32*.yaml whose `machine:` is this machine's CPU model and
# core count (cpu-fp32.yaml when none is): CPU speeds differ between hosts,
# so measure yours with `recfleet data calibrate --rates FILE --device cpu`.
# --worker-flag passes FLAG to every worker (e.g. --worker-flag --device=cuda
# for GPU workers; tools/gpu_demo.sh).
# Prometheus: `start` writes DIR/prometheus/ ready to scrape the cluster:
# deploy/prometheus/prometheus.yml and recfleet-rules.yml, and the file_sd
# target files that configuration reads (targets/coordinator.json,
# dataloader.json, worker.json). --prometheus also starts a Prometheus server
# (Debian's `prometheus`, on PATH) on it at 127.0.0.1 on a port the OS picks,
# data in DIR/prometheus/data, address in DIR/prometheus.address;
# --scrape-interval sets its scrape and rule-evaluation interval (default:
# prometheus.yml's).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 2 ]] || usage
cmd=$1 dir=$2
shift 2

root=$(cd "$(dirname "$0")/../.." && pwd)
bin="$root/bazel-bin"
workers=2
lease=10
loader=0
data_root=$(pwd)
topology="$root/deploy/local/cpu-topology.yaml"
# The CPU table: the one of bench/rates/cpu-fp32*.yaml measured on this
# machine's CPU model and core count (its `machine:` line), else cpu-fp32.yaml.
cpu_rates="$root/bench/rates/cpu-fp32.yaml"
this_cpu="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1), $(nproc) cores"
for f in "$root"/bench/rates/cpu-fp32*.yaml; do
  [[ -f $f && "$(sed -n 's/^machine: //p' "$f")" == "$this_cpu" ]] && cpu_rates=$f
done
step_rates=""
for f in "$root/bench/rates/h200-bf16.yaml" "$cpu_rates"; do
  [[ -f $f ]] && step_rates+="${step_rates:+,}$f"
done
tls=0
worker_flags=()
prometheus=0
scrape_interval=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --loader) loader=1; shift ;;
    --data-root) data_root=$(cd "$2" && pwd); shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --lease) lease=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --topology) topology=$2; shift 2 ;;
    --step-rates) step_rates=$2; shift 2 ;;
    --tls) tls=1; shift ;;
    --worker-flag) worker_flags+=("$2"); shift 2 ;;
    --prometheus) prometheus=1; shift ;;
    --scrape-interval) scrape_interval=$2; shift 2 ;;
    *) echo "cluster.sh: unknown flag $1" >&2; usage ;;
  esac
done

coordinator_bin=$bin/services/coordinator/recfleet-coordinator
worker_bin=$bin/worker/recfleet-worker
cli_bin=$bin/cli/recfleet
[[ -x $bin/recfleet-coordinator ]] && coordinator_bin=$bin/recfleet-coordinator
[[ -x $bin/recfleet-worker ]] && worker_bin=$bin/recfleet-worker
[[ -x $bin/recfleet ]] && cli_bin=$bin/recfleet

# Waits until FILE holds a line starting with PREFIX; prints the rest.
wait_line() {
  local file=$1 prefix=$2 pid=$3
  for _ in $(seq 1 200); do
    if line=$(grep -m1 "^$prefix" "$file" 2>/dev/null); then
      echo "${line#"$prefix"}"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "cluster.sh: '$prefix' never appeared in $file:" >&2
  tail -20 "$file" >&2
  return 1
}

# Writes DIR/prometheus/: the repository's Prometheus configuration and rules
# and one file_sd target file per scrape job, from DIR/metrics.txt
# ("NAME http://HOST:PORT/metrics" lines).
write_prometheus_config() {
  local p="$dir/prometheus"
  mkdir -p "$p/targets"
  cp "$root/deploy/prometheus/recfleet-rules.yml" "$p/"
  if [[ -n $scrape_interval ]]; then
    sed -E "s/^(  (scrape|evaluation)_interval:).*/\1 $scrape_interval/" \
      "$root/deploy/prometheus/prometheus.yml" >"$p/prometheus.yml"
  else
    cp "$root/deploy/prometheus/prometheus.yml" "$p/"
  fi
  chmod u+w "$p/prometheus.yml" "$p/recfleet-rules.yml"
  local kind name url
  for kind in coordinator dataloader worker; do
    local targets=()
    while read -r name url; do
      case $name in
        coordinator) [[ $kind == coordinator ]] || continue ;;
        loader) [[ $kind == dataloader ]] || continue ;;
        worker*) [[ $kind == worker ]] || continue ;;
        *) continue ;;
      esac
      url=${url#http://}
      targets+=("\"${url%%/*}\"")
    done <"$dir/metrics.txt"
    local joined
    joined=$(IFS=,; echo "${targets[*]-}")
    # Written whole, then renamed: Prometheus watches these files.
    echo "[{\"targets\": [$joined]}]" >"$p/targets/$kind.json.tmp"
    mv "$p/targets/$kind.json.tmp" "$p/targets/$kind.json"
  done
}

# Starts Prometheus on DIR/prometheus/prometheus.yml; prints its address.
start_prometheus() {
  command -v prometheus >/dev/null || {
    echo "cluster.sh: --prometheus needs Debian's prometheus package (tools/setup.sh installs it)" >&2
    return 1
  }
  prometheus --config.file="$dir/prometheus/prometheus.yml" \
    --storage.tsdb.path="$dir/prometheus/data" --web.listen-address=127.0.0.1:0 \
    >"$dir/prometheus.log" 2>&1 &
  local pid=$!
  echo "$pid" >>"$dir/pids"
  # Prometheus logs the port it got: msg="Listening on" address=127.0.0.1:PORT
  local line
  line=$(wait_line "$dir/prometheus.log" ".*msg=\"Listening on\" address=" "$pid") || return 1
  echo "${line##*address=}" >"$dir/prometheus.address"
  for _ in $(seq 1 100); do
    grep -q 'msg="Server is ready to receive web requests."' "$dir/prometheus.log" && return 0
    sleep 0.1
  done
  echo "cluster.sh: Prometheus did not become ready:" >&2
  tail -20 "$dir/prometheus.log" >&2
  return 1
}

start() {
  mkdir -p "$dir"
  : > "$dir/pids"
  : > "$dir/metrics.txt"
  local pid loader_address=""
  # Security flags of servers and of the workers (their client side).
  local server_tls=() loader_tls=() client_tls=()
  if [[ $tls == 1 ]]; then
    "$root/deploy/tls/make-certs.sh" "$dir/tls" >/dev/null
    local secret
    for secret in token worker-token data-grant-key; do
      (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/$secret")
    done
    server_tls=(--tls_cert="$dir/tls/server.pem" --tls_key="$dir/tls/server.key"
      --data_grant_key_file="$dir/data-grant-key")
    # `recfleet data serve` spells its flags in kebab-case.
    loader_tls=(--tls-cert="$dir/tls/server.pem" --tls-key="$dir/tls/server.key"
      --data-grant-key-file="$dir/data-grant-key" --auth-token-file="$dir/worker-token")
    server_tls+=(--auth_token_file="$dir/token" --worker_token_file="$dir/worker-token")
    client_tls=(--tls_ca="$dir/tls/ca.pem" --worker_token_file="$dir/worker-token")
  fi
  if [[ $loader == 1 ]]; then
    "$cli_bin" data serve --data-root "$data_root" --cache-dir "$dir/synthetic" --port 0 --metrics-port 0 \
      ${loader_tls[@]+"${loader_tls[@]}"} \
      >"$dir/loader.log" 2>&1 &
    pid=$!
    echo "$pid" >>"$dir/pids"
    local serving
    serving=$(wait_line "$dir/loader.log" "data loader on " "$pid")
    loader_address=${serving%% *}
    local loader_metrics=${serving#*metrics: }
    echo "loader ${loader_metrics%%)*}" >>"$dir/metrics.txt"
  fi
  "$coordinator_bin" --listen=127.0.0.1:0 --db="$dir/coordinator.db" --lease_seconds="$lease" \
    --loader_address="$loader_address" --metrics_address=127.0.0.1:0 --data_root="$data_root" \
    ${topology:+--hardware_topology="$topology"} ${step_rates:+--step_rates="$step_rates"} \
    ${server_tls[@]+"${server_tls[@]}"} >"$dir/coordinator.log" 2>&1 &
  pid=$!
  echo "$pid" >>"$dir/pids"
  local address
  address=$(wait_line "$dir/coordinator.log" "recfleet coordinator serving on " "$pid")
  address=${address%% *}
  echo "$address" >"$dir/coordinator.address"
  echo "coordinator $(wait_line "$dir/coordinator.log" "metrics on " "$pid")" >>"$dir/metrics.txt"
  for ((i = 0; i < workers; i++)); do
    mkdir -p "$dir/worker$i"
    "$worker_bin" --coordinator="$address" --host=127.0.0.1 --node="node$i" --zone=local \
      --data_root="$data_root" --work_dir="$dir/worker$i" --checkpoint_root="$dir/checkpoints" \
      --metrics_address=127.0.0.1:0 ${client_tls[@]+"${client_tls[@]}"} \
      ${worker_flags[@]+"${worker_flags[@]}"} >"$dir/worker$i.log" 2>&1 &
    pid=$!
    echo "$pid" >>"$dir/pids"
    echo "worker$i $(wait_line "$dir/worker$i.log" "worker metrics: " "$pid")" >>"$dir/metrics.txt"
  done
  write_prometheus_config
  [[ $prometheus == 0 ]] || start_prometheus
  echo "coordinator: $address (logs and state in $dir)"
  [[ -z $loader_address ]] || echo "data-loader: $loader_address"
  if [[ $tls == 1 ]]; then
    echo "TLS on; for the CLI: export RECFLEET_TLS_CA=$dir/tls/ca.pem RECFLEET_AUTH_TOKEN=\$(cat $dir/token)"
  fi
  sed 's/^/metrics: /' "$dir/metrics.txt"
  if [[ $prometheus == 1 ]]; then
    echo "prometheus: http://$(cat "$dir/prometheus.address") (config in $dir/prometheus)"
  else
    echo "prometheus: prometheus --config.file=$dir/prometheus/prometheus.yml scrapes this cluster"
  fi
}

stop() {
  [[ -f $dir/pids ]] || return 0
  # Workers first, then the coordinator (first line).
  tac "$dir/pids" | while read -r pid; do kill "$pid" 2>/dev/null || true; done
  for _ in $(seq 1 50); do
    alive=0
    while read -r pid; do kill -0 "$pid" 2>/dev/null && alive=1; done <"$dir/pids"
    [[ $alive == 0 ]] && break
    sleep 0.1
  done
  while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done <"$dir/pids"
  rm -f "$dir/pids"
}

case $cmd in
  start) start ;;
  stop) stop ;;
  *) usage ;;
esac
