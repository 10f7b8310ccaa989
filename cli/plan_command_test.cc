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
  // (Not a model GEM-lite builds, so planned as a what-if.)
  EXPECT_EQ(plan->run({huge, "--topology", topo, "--what-if"}), cli::kExitFailure);
}

TEST(PlanCommandTest, RefusesARateTableOfTheOtherDevice) {
  const cli::Command* plan = PlanCommand();
  ASSERT_NE(plan, nullptr);
  const std::string job = "deploy/examples/job-gemlite.yaml";
  const std::string gpus = "deploy/examples/topology-small.yaml", cpus = "deploy/local/cpu-topology.yaml";
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(plan->run({job, "--topology", gpus, "--rates", "bench/rates/h200-bf16.yaml"}), cli::kExitOk);
  EXPECT_EQ(plan->run({job, "--topology", cpus, "--rates", "bench/rates/cpu-fp32.yaml"}), cli::kExitOk);
  ::testing::internal::GetCapturedStdout();
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(plan->run({job, "--topology", gpus, "--rates", "bench/rates/cpu-fp32.yaml"}), cli::kExitUsage);
  EXPECT_EQ(plan->run({job, "--topology", cpus, "--rates", "bench/rates/h200-bf16.yaml"}), cli::kExitUsage);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("was measured on cpu"), std::string::npos) << err;
  EXPECT_NE(err.find("was measured on cuda"), std::string::npos) << err;
}

TEST(PlanCommandTest, PlansAJobSpecFileThroughTheAdapter) {
  const cli::Command* plan = PlanCommand();
  ASSERT_NE(plan, nullptr);
  const std::string topo = "deploy/examples/topology-small.yaml";
  ::testing::internal::CaptureStdout();
  const int code = plan->run({"deploy/examples/job-gemlite.yaml", "--topology", topo, "--json"});
  const std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(code, cli::kExitOk);
  // The adapter's modules and the spec's tables reach the plan.
  EXPECT_NE(out.find("item_category"), std::string::npos);
  EXPECT_NE(out.find("moe1"), std::string::npos);
  EXPECT_NE(out.find("\"sequence\""), std::string::npos);

  // A JobSpec file whose table cannot fit: exit 1; a malformed one: exit 2.
  const std::string huge = Write("huge-spec.yaml", R"(
model:
  tables: [{name: ids, rows: 100000000000, dim: 64}]
  features: [{name: id, kind: ID_LIST, table: ids}]
  heads: [{kind: CTR, label: click}]
data: {dataset: "file:///tmp/x", local_batch_size: 128}
resources: {workers: 2}
training: {steps: 1, dense_learning_rate: 0.001, sparse_learning_rate: 0.01}
)");
  // (Not a model GEM-lite builds, so planned as a what-if.)
  EXPECT_EQ(plan->run({huge, "--topology", topo, "--what-if"}), cli::kExitFailure);
  const std::string bad = Write("bad-spec.yaml", R"(
model:
  tables: [{name: ids, rows: 1000, dim: 0}]
  features: [{name: id, kind: ID_LIST, table: ids}]
  heads: [{kind: CTR, label: click}]
data: {dataset: "file:///tmp/x", local_batch_size: 128}
resources: {workers: 2}
training: {steps: 1, dense_learning_rate: 0.001, sparse_learning_rate: 0.01}
)");
  EXPECT_EQ(plan->run({bad, "--topology", topo}), cli::kExitUsage);
}

// The example job file's text.
std::string ExampleJob() {
  std::ifstream in("deploy/examples/job-gemlite.yaml");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(PlanCommandTest, JobHintsAreHonoredAndExplained) {
  const cli::Command* plan = PlanCommand();
  ASSERT_NE(plan, nullptr);
  std::string text = ExampleJob();
  const size_t at = text.find("parallelism: {}");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 15, "parallelism: {fsdp_group_size: 1}");
  const std::string job = Write("hinted.yaml", text);
  ::testing::internal::CaptureStdout();
  const int code = plan->run({job, "--topology", "deploy/examples/topology-small.yaml"});
  const std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(code, cli::kExitOk) << out;
  EXPECT_NE(out.find("set by the job's hints (parallelism.fsdp_group_size = 1)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("parallelism hints"), std::string::npos) << out;
}

// A job file goes through the checks `recfleet submit` meets, so plan shows
// nothing CreateJob would refuse; --what-if plans such a job anyway.
TEST(PlanCommandTest, JobFilesMeetTheSubmissionChecks) {
  const cli::Command* plan = PlanCommand();
  ASSERT_NE(plan, nullptr);
  const std::string base = ExampleJob();
  const std::string topo = "deploy/examples/topology-small.yaml";
  // An FP8 recipe on a CPU job (gpus_per_worker: 0): structurally fine,
  // refused at submission.
  std::string fp8 = base;
  const size_t at = fp8.find("\nmodel:\n");
  ASSERT_NE(at, std::string::npos);
  fp8.insert(at + 8, "  precision: {fp8_modules: [dcn]}\n");
  const std::string fp8_job = Write("fp8-on-cpu.yaml", fp8);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(plan->run({fp8_job, "--topology", topo}), cli::kExitUsage);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("would refuse"), std::string::npos) << err;
  EXPECT_NE(err.find("spec.model.precision.fp8_modules"), std::string::npos) << err;
  // Also before asking a coordinator (nothing listens on port 1: a job that
  // passed would exit kExitUnavailable).
  EXPECT_EQ(plan->run({fp8_job, "--coordinator", "127.0.0.1:1", "--timeout", "2"}), cli::kExitUsage);
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(plan->run({fp8_job, "--topology", topo, "--what-if"}), cli::kExitOk);
  ::testing::internal::GetCapturedStdout();
  // Several GPUs per worker: planned only as a what-if.
  std::string gpus = base;
  const size_t g = gpus.find("gpus_per_worker: 0");
  ASSERT_NE(g, std::string::npos);
  gpus.replace(g, 18, "gpus_per_worker: 8");
  const std::string gpu_job = Write("eight-gpus.yaml", gpus);
  EXPECT_EQ(plan->run({gpu_job, "--topology", topo}), cli::kExitUsage);
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(plan->run({gpu_job, "--topology", topo, "--what-if"}), cli::kExitOk);
  ::testing::internal::GetCapturedStdout();
}

TEST(PlanCommandTest, CoordinatorFlagsAreChecked) {
  const cli::Command* plan = PlanCommand();
  ASSERT_NE(plan, nullptr);
  const std::string spec = "deploy/examples/job-gemlite.yaml";
  const std::string own = Write("own-format.yaml", kJob);
  // The planner's own format cannot travel as a JobSpec.
  EXPECT_EQ(plan->run({own, "--coordinator", "127.0.0.1:1"}), cli::kExitUsage);
  EXPECT_EQ(plan->run({spec, "--coordinator", "127.0.0.1:1", "--topology",
                       "deploy/examples/topology-small.yaml"}),
            cli::kExitUsage);
  EXPECT_EQ(plan->run({spec, "--coordinator", "127.0.0.1:1", "--html", TempPath("x.html")}),
            cli::kExitUsage);
  EXPECT_EQ(plan->run({spec, "--coordinator", "not-an-address"}), cli::kExitUsage);
  EXPECT_EQ(plan->run({spec, "--coordinator", "127.0.0.1:1", "--timeout", "-1"}),
            cli::kExitUsage);
  EXPECT_EQ(plan->run({spec, "--coordinator", "127.0.0.1:1", "--auth-token-file",
                       TempPath("no-such-token")}),
            cli::kExitUsage);
  // Nothing listens on port 1.
  EXPECT_EQ(plan->run({spec, "--coordinator", "127.0.0.1:1", "--timeout", "2"}),
            cli::kExitUnavailable);
}

}  // namespace
}  // namespace recfleet::planner
