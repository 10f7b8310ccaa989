// Planning time at fleet scale: 16,384 GPUs (2,048 hosts of 8 in 16 zones)
// and 2,000 embedding tables, single-threaded (the planner uses one core).
//
//   bazel run //bench/planner:planner_bench -- [--runs N] [--job JOB.yaml --topology TOPO.yaml]
//
// Without files it plans a built-in GEM-scale job whose 2,000 tables have
// deterministic, varied sizes (a few giant sequence tables, a long tail of
// small ones). Prints every run's wall time and process CPU time (the
// latter is what matters on a shared, oversubscribed machine) and medians.

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "planner/planner.h"
#include "planner/sharding.h"
#include "planner/yaml_io.h"

namespace recfleet::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

Topology Fleet16k() {
  Topology t;
  t.name = "h200-16k (built in)";
  t.num_nodes = 2048;
  t.gpus_per_node = 8;
  t.nodes_per_zone = 128;
  t.hbm_bytes_per_gpu = 141 * kGiB;
  t.peak_flops_per_gpu = 989e12;
  t.hbm_bandwidth_bytes_per_s = 4.8e12;
  t.links[kNvlink] = {450e9, 3e-6};
  t.links[kZone] = {50e9, 10e-6};
  t.links[kCrossZone] = {6.25e9, 30e-6};
  return t;
}

PlanRequest Gem2000Tables() {
  PlanRequest r;
  r.local_batch = 1024;
  r.precision.fp8_kept_activations = true;
  Model& m = r.model;
  m.name = "gem-2000-tables (built in)";
  m.sequence_lengths = {{256, 0.45}, {1024, 0.35}, {4096, 0.15}, {8192, 0.05}};
  auto module = [&](const std::string& name, const std::string& region, OpKind op, double params,
                    double per_sample, double per_token, double per_token_sq, double act_sample,
                    double act_token, int experts) {
    DenseModule d;
    d.name = name;
    d.region = region;
    d.op = op;
    d.params = static_cast<int64_t>(params);
    d.flops_per_sample = per_sample;
    d.flops_per_token = per_token;
    d.flops_per_token_sq = per_token_sq;
    d.activation_bytes_per_sample = act_sample;
    d.activation_bytes_per_token = act_token;
    d.io_bytes_per_sample = 4096;
    d.num_experts = experts;
    m.modules.push_back(d);
  };
  for (int i = 0; i < 4; ++i) {
    module(absl::StrCat("seq_block_", i), "sequence", OpKind::kAttention, 60e6, 0, 3e7, 8192, 0,
           24576, 0);
  }
  module("pma_cross", "cross", OpKind::kAttention, 30e6, 0, 1.5e7, 0, 0, 8192, 0);
  module("dhen_experts", "interaction", OpKind::kGemm, 3.2e9, 6.4e9, 0, 0, 262144, 0, 16);
  module("dcn", "interaction", OpKind::kGemm, 200e6, 4e8, 0, 0, 65536, 0, 0);
  module("heads", "heads", OpKind::kGemm, 20e6, 4e7, 0, 0, 16384, 0, 0);
  std::mt19937 rng(2000);
  std::uniform_real_distribution<double> u(0, 1);
  for (int i = 0; i < 2000; ++i) {
    Table t;
    t.name = absl::StrCat("table_", i);
    if (i < 4) {  // Item / action histories: sequence tables.
      t.rows = static_cast<int64_t>(1e9 * (1 + u(rng)));
      t.dim = 128;
      t.pooled = false;
      t.pooling_factor = 1000;
    } else {  // Log-uniform rows from 1e3 to 1e8.
      t.rows = static_cast<int64_t>(std::pow(10.0, 3 + 5 * u(rng)));
      t.dim = 16 << static_cast<int>(u(rng) * 3);
      t.pooling_factor = 1 + 40 * u(rng) * u(rng);
      t.access_frequency = 0.05 + 0.95 * u(rng);
    }
    m.tables.push_back(t);
  }
  return r;
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

int Main(int argc, char** argv) {
  int runs = 5;
  std::string job_path, topology_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--job") && i + 1 < argc) {
      job_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--topology") && i + 1 < argc) {
      topology_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: planner_bench [--runs N] [--job JOB.yaml --topology TOPO.yaml]\n");
      return 2;
    }
  }
  Topology topology = Fleet16k();
  PlanRequest request = Gem2000Tables();
  if (!topology_path.empty()) {
    auto t = LoadTopologyYaml(topology_path);
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", std::string(t.status().message()).c_str());
      return 2;
    }
    topology = *t;
  }
  if (!job_path.empty()) {
    auto r = LoadJobYaml(job_path);
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", std::string(r.status().message()).c_str());
      return 2;
    }
    request = *r;
  }
  std::printf("topology %s: %d GPUs (%d zones); model %s: %zu tables, %zu dense modules\n",
              topology.name.c_str(), topology.WorldSize(), topology.NumZones(),
              request.model.name.c_str(), request.model.tables.size(),
              request.model.modules.size());

  // The costliest single stage: sharding every table over one group of the
  // whole fleet (the V1 candidate).
  {
    ShardingInput in{&request.model, &topology, &request.precision, &request.efficiency,
                     &request.options, MakeGroup(topology, topology.WorldSize(), 1),
                     request.local_batch, 1, topology.hbm_bytes_per_gpu};
    const auto start = std::chrono::steady_clock::now();
    auto sharded = ShardTables(in);
    std::printf("shard 2,000 tables over one group of %d: %.3f s (%s)\n", topology.WorldSize(),
                Seconds(std::chrono::steady_clock::now() - start),
                sharded.ok() ? "ok" : std::string(sharded.status().message()).c_str());
  }

  std::vector<double> times, cpu_times;
  absl::StatusOr<Plan> plan;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const std::clock_t cpu_start = std::clock();
    plan = MakePlan(topology, request);
    cpu_times.push_back(static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC);
    times.push_back(Seconds(std::chrono::steady_clock::now() - start));
    std::printf("run %d: MakePlan %.3f s wall, %.3f s CPU\n", i + 1, times.back(),
                cpu_times.back());
  }
  if (!plan.ok()) {
    std::printf("plan failed: %s\n", std::string(plan.status().message()).c_str());
    return 1;
  }
  std::sort(times.begin(), times.end());
  std::sort(cpu_times.begin(), cpu_times.end());
  const double median = times[times.size() / 2];
  std::printf(
      "median %.3f s wall (%.3f s CPU), min %.3f s wall over %d runs; target < 5 s: %s\n"
      "plan: %d candidate pairs, FSDP group %d, %s groups of %d (V3 degree %d), predicted step "
      "%.1f ms, scaling ratio %.3f\n",
      median, cpu_times[cpu_times.size() / 2], times.front(), runs, median < 5 ? "met" : "NOT met", plan->candidates_evaluated,
      plan->dense.fsdp_group, SparseSchemeName(plan->sparse.scheme), plan->sparse.mp_group,
      plan->sparse.v3_shard_degree, plan->step.total_s * 1e3, plan->step.scaling_ratio);
  return 0;
}

}  // namespace
}  // namespace recfleet::planner

int main(int argc, char** argv) { return recfleet::planner::Main(argc, argv); }
