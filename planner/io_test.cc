// The YAML front end and the three renderings of a plan.

#include <string>

#include "gtest/gtest.h"
#include "planner/planner.h"
#include "planner/report.h"
#include "planner/yaml_io.h"

namespace recfleet::planner {
namespace {

constexpr char kTopology[] = R"(
name: two-hosts
nodes: 2
gpus_per_node: 8
gpu: {hbm_gib: 80, peak_tflops: 989, hbm_bandwidth_gbps: 3350}
links:
  nvlink: {bandwidth_gbps: 450, latency_us: 3}
  zone: {bandwidth_gbps: 50, latency_us: 10}
)";

constexpr char kJob[] = R"(
name: tiny
batch: {local: 256}
precision: {embedding: fp16, kept_activations: fp8, fp8_modules: [experts]}
efficiency: {gemm: 0.5}
planner: {hbm_reserve: 0.1, max_model_parallel_group: 8}
model:
  sequence_lengths: [{length: 100, fraction: 1}]
  dense:
    - {name: seq, op: attention, params: 1.0e6, flops_per_token: 2.0e6,
       activation_bytes_per_token: 4096, io_bytes_per_sample: 512}
    - {name: experts, params: 8.0e7, experts: 8, flops_per_sample: 1.6e8,
       activation_bytes_per_sample: 8192, io_bytes_per_sample: 512}
  tables:
    - {name: item, rows: 1.0e6, dim: 64, pooled: false, pooling_factor: 100}
    - {name: feat, count: 3, rows: 1000, dim: 16, access_frequency: 0.5}
)";

TEST(YamlTest, ParsesTopologyInPeopleUnits) {
  absl::StatusOr<Topology> t = ParseTopologyYaml(kTopology, "topo.yaml");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->WorldSize(), 16);
  EXPECT_EQ(t->nodes_per_zone, 2);  // Default: one zone.
  EXPECT_DOUBLE_EQ(t->hbm_bytes_per_gpu, 80.0 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(t->peak_flops_per_gpu, 989e12);
  EXPECT_DOUBLE_EQ(t->links[kNvlink].bandwidth_bytes_per_s, 450e9);
  EXPECT_DOUBLE_EQ(t->links[kZone].latency_s, 10e-6);
}

TEST(YamlTest, ParsesJobAndExpandsTableFamilies) {
  absl::StatusOr<PlanRequest> r = ParseJobYaml(kJob, "job.yaml");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model.name, "tiny");
  EXPECT_EQ(r->local_batch, 256);
  ASSERT_EQ(r->model.modules.size(), 2u);
  EXPECT_EQ(r->model.modules[0].op, OpKind::kAttention);
  EXPECT_EQ(r->model.modules[1].num_experts, 8);
  EXPECT_EQ(r->model.modules[1].params, 80000000);
  ASSERT_EQ(r->model.tables.size(), 4u);
  EXPECT_EQ(r->model.tables[3].name, "feat_2");
  EXPECT_FALSE(r->model.tables[0].pooled);
  EXPECT_EQ(r->precision.embedding_bytes, 2);
  EXPECT_TRUE(r->precision.fp8_kept_activations);
  EXPECT_TRUE(r->precision.fp8_modules.count("experts"));
  EXPECT_DOUBLE_EQ(r->efficiency.gemm, 0.5);
  EXPECT_DOUBLE_EQ(r->options.hbm_reserve_fraction, 0.1);
  EXPECT_EQ(r->options.max_model_parallel_group, 8);
}

TEST(YamlTest, ParsesHintsOverlapAndCpuCores) {
  auto r = ParseJobYaml(std::string(kJob) +
                            "parallelism: {fsdp_group_size: 2, replicas: 8, "
                            "table_sharding_group_size: 4}\n",
                        "job.yaml");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->hints.fsdp_group_size, 2);
  EXPECT_EQ(r->hints.replicas, 8);
  EXPECT_EQ(r->hints.table_sharding_group_size, 4);
  EXPECT_TRUE(r->options.overlap_collectives);
  auto bad = ParseJobYaml(std::string(kJob) + "parallelism: {fsdp: 2}\n", "job.yaml");
  EXPECT_NE(bad.status().message().find("unknown key 'parallelism.fsdp'"), std::string::npos)
      << bad.status();

  auto cpu = ParseTopologyYaml(
      "nodes: 1\ngpus_per_node: 4\ncpu_cores_per_node: 2\n"
      "gpu: {hbm_gib: 8, peak_tflops: 0.05, hbm_bandwidth_gbps: 5}\n"
      "links: {nvlink: {bandwidth_gbps: 1, latency_us: 40}}\n",
      "cpu.yaml");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_DOUBLE_EQ(cpu->cpu_cores_per_node, 2);
  EXPECT_DOUBLE_EQ(cpu->ComputeShare(), 0.5);
  cpu->gpus_per_node = 2;
  EXPECT_DOUBLE_EQ(cpu->ComputeShare(), 1.0);
}

TEST(YamlTest, ErrorsNameTheKeyAndTheExpectedForm) {
  auto topo = ParseTopologyYaml("nodes: 2\ngpus_per_node: 8\ngpu: {hbm_gib: x}\n", "t.yaml");
  ASSERT_FALSE(topo.ok());
  EXPECT_NE(topo.status().message().find("t.yaml: 'gpu.hbm_gib' must be a number"),
            std::string::npos)
      << topo.status();
  auto typo = ParseJobYaml(std::string(kJob) + "batchsize: 3\n", "j.yaml");
  EXPECT_NE(typo.status().message().find("unknown key 'batchsize'"), std::string::npos)
      << typo.status();
  auto dtype = ParseJobYaml(
      "batch: {local: 1}\nprecision: {embedding: fp64}\nmodel: {dense: []}\n", "j.yaml");
  EXPECT_NE(dtype.status().message().find("'precision.embedding' must be one of fp32"),
            std::string::npos)
      << dtype.status();
  auto fraction = ParseJobYaml(
      "batch: {local: 1}\nmodel: {tables: [{name: a, rows: 1.5, dim: 4}]}\n", "j.yaml");
  EXPECT_NE(fraction.status().message().find("'model.tables[0].rows' must be a whole number"),
            std::string::npos)
      << fraction.status();
  auto syntax = ParseJobYaml("batch: {local: 1\n", "j.yaml");
  EXPECT_NE(syntax.status().message().find("j.yaml: line"), std::string::npos) << syntax.status();
  auto missing = LoadJobYaml("no/such/job.yaml");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

TEST(ReportTest, TextJsonAndHtmlCarryThePlan) {
  auto t = ParseTopologyYaml(kTopology, "topo.yaml");
  auto r = ParseJobYaml(kJob, "job.yaml");
  ASSERT_TRUE(t.ok() && r.ok());
  absl::StatusOr<Plan> plan = MakePlan(*t, *r);
  ASSERT_TRUE(plan.ok()) << plan.status();

  const std::string text = FormatText(*plan);
  for (const char* section : {"PREDICTED STEP", "DENSE MESH", "SPARSE LAYOUT", "PLACEMENT",
                              "PER-GPU MEMORY", "ACTIVATION CHECKPOINT", "COMMUNICATION PER STEP",
                              "TRAFFIC PER LINK LEVEL", "TABLES", "DECISIONS", "feat_2"}) {
    EXPECT_NE(text.find(section), std::string::npos) << section;
  }

  const std::string json = FormatJson(*plan);
  EXPECT_EQ(json.front(), '{');
  EXPECT_NE(json.find("\"scaling_ratio\":"), std::string::npos);
  EXPECT_NE(json.find("\"fsdp_group\":" + std::to_string(plan->dense.fsdp_group)),
            std::string::npos);
  EXPECT_NE(json.find("\"table\":\"item\""), std::string::npos);
  // Balanced braces and brackets outside strings: a cheap well-formedness check.
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '{' || c == '[') ++depth;
    if (c == '}' || c == ']') --depth;
    ASSERT_GE(depth, 0);
  }
  EXPECT_EQ(depth, 0);

  const std::string html = FormatHtml(*plan);
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("Per-GPU memory"), std::string::npos);
  EXPECT_NE(html.find("Traffic per link level"), std::string::npos);
  EXPECT_NE(html.find("</html>"), std::string::npos);
  // One memory bar segment per part per group position (5 x 16 here).
  size_t bars = 0;
  for (size_t p = html.find("<title>position "); p != std::string::npos;
       p = html.find("<title>position ", p + 1)) {
    ++bars;
  }
  EXPECT_EQ(bars, 5u * plan->rank_memory.size());
}

}  // namespace
}  // namespace recfleet::planner
