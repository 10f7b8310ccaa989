// `recfleet plan` through the command table, on files written to a temp dir.

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "gtest/gtest.h"

namespace recfleet::planner {
namespace {

const cli::Command* PlanCommand() {
  for (const cli::Command* c : cli::AllCommands()) {
    if (c->name == "plan") return c;
  }
  return nullptr;
}

std::string TempPath(const std::string& name) { return ::testing::TempDir() + name; }

std::string Write(const std::string& name, const std::string& text) {
  const std::string path = TempPath(name);
  std::ofstream(path) << text;
  return path;
}

constexpr char kTopology[] = R"(
name: one-host
nodes: 1
gpus_per_node: 8
gpu: {hbm_gib: 80, peak_tflops: 989, hbm_bandwidth_gbps: 3350}
links:
  nvlink: {bandwidth_gbps: 450, latency_us: 3}
)";

constexpr char kJob[] = R"(
batch: {local: 128}
model:
  dense:
    - {name: mlp, params: 1.0e8, flops_per_sample: 2.0e8, activation_bytes_per_sample: 4096}
  tables:
    - {name: item, rows: 1.0e6, dim: 64}
)";

TEST(PlanCommandTest, PlansWritesHtmlAndReportsErrorsWithExitCodes) {
  const cli::Command* plan = PlanCommand();
  ASSERT_NE(plan, nullptr);
  const std::string topo = Write("topo.yaml", kTopology);
  const std::string job = Write("job.yaml", kJob);
  const std::string html = TempPath("plan.html");

  EXPECT_EQ(plan->run({job, "--topology", topo, "--html", html}), cli::kExitOk);
  std::ifstream in(html);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(ss.str().find("<svg"), std::string::npos);

  EXPECT_EQ(plan->run({job, "--topology=" + topo, "--json"}), cli::kExitOk);
  EXPECT_EQ(plan->run({job}), cli::kExitUsage);
  EXPECT_EQ(plan->run({job, "--topology", topo, "--bogus"}), cli::kExitUsage);
  EXPECT_EQ(plan->run({TempPath("missing.yaml"), "--topology", topo}), cli::kExitUsage);

  // 1e11 rows x 64 x 4 bytes cannot fit on one host: exit 1, not a crash.
  const std::string huge = Write(
      "huge.yaml", "batch: {local: 128}\nmodel: {tables: [{name: item, rows: 1.0e11, dim: 64}]}\n");
  EXPECT_EQ(plan->run({huge, "--topology", topo}), cli::kExitFailure);
}

}  // namespace
}  // namespace recfleet::planner
