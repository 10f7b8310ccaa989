// `recfleet train --local` trains a JobSpec file on an `.rfd` dataset that
// `recfleet data ingest` made from an implicit-feedback event log (no
// ratings: ingest pairs each event with a sampled negative), through the
// worker's step code, and prints the eval AUC next to the item-popularity
// baseline on the same split.

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cli/command.h"
#include "data/ingest.h"
#include "gtest/gtest.h"

namespace recfleet::cli {
namespace {

std::string Tmp(const std::string& name) { return std::string(testing::TempDir()) + "/" + name; }

// 400 users, each mostly clicking items of one of 8 categories (items are
// numbered so that item % 8 is its category, low numbers more popular), 24
// events each, in time order.
std::string WriteImplicitLog() {
  const std::string path = Tmp("clicks.csv");
  std::ofstream out(path);
  out << "user,item,ts\n";
  std::mt19937_64 rng(5);
  for (int u = 0; u < 400; ++u) {
    const int taste = u % 8;
    for (int e = 0; e < 24; ++e) {
      const double u01 = static_cast<double>(rng() % 1000000) / 1e6;
      const int item = static_cast<int>(30 * u01 * u01) * 8 + (rng() % 10 < 8 ? taste : static_cast<int>(rng() % 8));
      out << "u" << u << ",i" << item << "," << (1000 * u + e) << "\n";
    }
  }
  return path;
}

constexpr char kJob[] = R"(display_name: implicit
model:
  tables:
    - {name: item, rows: 400, dim: 16}
    - {name: user, rows: 512, dim: 16}
  features:
    - {name: user_id, kind: ID_LIST, table: user}
    - {name: item_id, kind: CANDIDATE, table: item}
    - {name: history_items, kind: SEQUENCE, table: item, max_length: 20}
  sequence: {features: [history_items], num_layers: 1, model_dim: 16, num_heads: 2, attention: {kind: FULL}}
  cross: {num_cross_layers: 1, pma_queries: 1, num_heads: 2}
  dense:
    - dcn: {num_layers: 1}
    - moe: {num_experts: 2, top_k: 2, expert_hidden_dims: [32, 16]}
  heads:
    - {kind: CTR, label: label, hidden_dims: [8]}
data: {dataset: DATASET, local_batch_size: 64}
resources: {workers: 4}
training: {steps: 600, dense_learning_rate: 0.003, sparse_learning_rate: 0.5, seed: 2}
)";

// kJob on a dataset that does not exist, with each `edits` pair's first
// text replaced by its second, written to Tmp(name); its path.
std::string NowhereJob(const std::string& name, const std::vector<std::pair<std::string, std::string>>& edits = {}) {
  std::string job = kJob;
  job.replace(job.find("DATASET"), 7, Tmp("nowhere"));
  for (const auto& [from, to] : edits) job.replace(job.find(from), from.size(), to);
  const std::string path = Tmp(name);
  std::ofstream(path) << job;
  return path;
}

// The number after `label` on the line that holds it, or -1.
double Number(const std::string& text, const std::string& label) {
  const size_t at = text.find(label);
  if (at == std::string::npos) return -1;
  double v = -1;
  size_t end = text.find_first_of(" \n", at + label.size());
  absl::SimpleAtod(text.substr(at + label.size(), end - at - label.size()), &v);
  return v;
}

// Ingests the implicit log into Tmp("implicit") (once per process).
void IngestImplicitLog() {
  static bool done = false;
  if (done) return;
  data::IngestOptions o;
  o.path = WriteImplicitLog();
  o.user_column = "user";
  o.item_column = "item";
  o.time_column = "ts";
  o.rating_column = "";  // Implicit feedback: ingest samples the negatives.
  o.max_history = 20;
  o.eval_fraction = 0.2;
  absl::StatusOr<data::IngestStats> stats = data::Ingest(o, Tmp("implicit"));
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_GT(stats->train_samples, stats->events);  // Negatives were added.
  done = true;
}

TEST(TrainCommandTest, TrainsAnIngestedImplicitLogAndBeatsItemPopularity) {
  ASSERT_NO_FATAL_FAILURE(IngestImplicitLog());
  std::string job = kJob;
  job.replace(job.find("DATASET"), 7, Tmp("implicit"));
  const std::string job_path = Tmp("implicit.yaml");
  std::ofstream(job_path) << job;

  const Command* train = FindCommand("train");
  ASSERT_NE(train, nullptr);
  testing::internal::CaptureStdout();
  const int code = train->run({"--local", job_path, "--checkpoint-dir", Tmp("ckpt"), "--log-every", "200"});
  const std::string out = testing::internal::GetCapturedStdout();
  ASSERT_EQ(code, kExitOk) << out;
  const double popularity = Number(out, "item popularity  AUC ");
  const double model = Number(out, "model            AUC ");
  std::printf("%s", out.c_str());
  ASSERT_GT(popularity, 0) << out;
  ASSERT_GT(model, 0) << out;
  // Popularity knows nothing of a user's taste; the history does.
  EXPECT_GT(popularity, 0.55) << out;
  EXPECT_GT(model, popularity + 0.1) << out;
}

// A step whose loss is not finite ends the run there, naming the step,
// instead of training on (and checkpointing) NaN parameters.
TEST(TrainCommandTest, ADivergingRunStopsAtTheFirstNonFiniteLoss) {
  ASSERT_NO_FATAL_FAILURE(IngestImplicitLog());
  std::string job = kJob;
  job.replace(job.find("DATASET"), 7, Tmp("implicit"));
  const std::string rates = "dense_learning_rate: 0.003, sparse_learning_rate: 0.5";
  job.replace(job.find(rates), rates.size(), "dense_learning_rate: 1e300, sparse_learning_rate: 1e300");
  const std::string job_path = Tmp("diverging.yaml");
  std::ofstream(job_path) << job;
  const Command* train = FindCommand("train");
  ASSERT_NE(train, nullptr);
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const int code = train->run({"--local", job_path, "--checkpoint-dir", Tmp("ckpt-diverging"), "--log-every", "1"});
  const std::string out = testing::internal::GetCapturedStdout();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, kExitFailure) << out << err;
  const size_t at = err.find("training diverged at step ");
  ASSERT_NE(at, std::string::npos) << out << err;
  std::printf("%s", err.substr(at).c_str());
  EXPECT_NE(err.find("the loss is not finite"), std::string::npos) << err;
  // Long before the 600 steps, and no eval of a NaN model was printed.
  const double step = Number(err.substr(at), "training diverged at step ");
  EXPECT_GE(step, 1) << err;
  EXPECT_LT(step, 50) << err;
  EXPECT_EQ(out.find("AUC"), std::string::npos) << out;
}

TEST(TrainCommandTest, RejectsWhatTheJobCannotBuildAndBadFlags) {
  const Command* train = FindCommand("train");
  ASSERT_NE(train, nullptr);
  const std::string job_path = NowhereJob("topk.yaml", {{"top_k: 2", "top_k: 1"}});
  testing::internal::CaptureStderr();
  EXPECT_EQ(train->run({"--local", job_path}), kExitUsage);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("spec.model.dense[1].moe.top_k: not supported yet"), std::string::npos) << err;
  testing::internal::CaptureStderr();
  EXPECT_EQ(train->run({"--local"}), kExitUsage);
  EXPECT_EQ(train->run({"--local", Tmp("no-such-job.yaml")}), kExitNotFound);
  EXPECT_NE(testing::internal::GetCapturedStderr().find("--local needs a value"), std::string::npos);
  // Device flags: named choices only, precision only where it applies.
  testing::internal::CaptureStderr();
  EXPECT_EQ(train->run({"--local", job_path, "--device", "gpu"}), kExitUsage);
  EXPECT_EQ(train->run({"--local", job_path, "--precision", "bf16"}), kExitUsage);
  EXPECT_EQ(train->run({"--local", job_path, "--device", "cuda", "--precision", "fp16"}), kExitUsage);
  const std::string device_err = testing::internal::GetCapturedStderr();
  EXPECT_NE(device_err.find("--device is cpu or cuda"), std::string::npos) << device_err;
  EXPECT_NE(device_err.find("--precision applies to --device cuda only"), std::string::npos) << device_err;
  testing::internal::CaptureStdout();
  EXPECT_EQ(RunCommand(*train, {"--help"}), kExitOk);  // --help is RunCommand's, as for every command.
  EXPECT_NE(testing::internal::GetCapturedStdout().find("usage: recfleet train --local"), std::string::npos);
}

// --device decides whether the local run is a GPU job: the GPU-only fields
// of model.precision (here FP8 GEMMs) are refused on the CPU, with the flag
// that runs them named, and pass validation with --device cuda (which then
// stops at the missing dataset or device, not at the spec).
TEST(TrainCommandTest, GpuOnlyPrecisionNeedsDeviceCuda) {
  const Command* train = FindCommand("train");
  ASSERT_NE(train, nullptr);
  const std::pair<std::string, std::string> fp8 = {"  heads:", "  precision: {fp8_modules: [dcn]}\n  heads:"};
  const std::string job_path = NowhereJob("fp8.yaml", {fp8});
  testing::internal::CaptureStderr();
  EXPECT_EQ(train->run({"--local", job_path}), kExitUsage);
  const std::string cpu_err = testing::internal::GetCapturedStderr();
  EXPECT_NE(cpu_err.find("spec.model.precision.fp8_modules: FP8 GEMMs need a GPU job"), std::string::npos) << cpu_err;
  EXPECT_NE(cpu_err.find("with --device cuda"), std::string::npos) << cpu_err;
  testing::internal::CaptureStderr();
  testing::internal::CaptureStdout();
  EXPECT_NE(train->run({"--local", job_path, "--device", "cuda"}), kExitUsage);
  testing::internal::GetCapturedStdout();
  const std::string cuda_err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(cuda_err.find("spec."), std::string::npos) << cuda_err;
  // A spec error that no device fixes names no device.
  NowhereJob("fp8.yaml", {fp8, {"top_k: 2", "top_k: 1"}});
  testing::internal::CaptureStderr();
  EXPECT_EQ(train->run({"--local", job_path}), kExitUsage);
  const std::string topk_err = testing::internal::GetCapturedStderr();
  EXPECT_NE(topk_err.find("moe.top_k: not supported yet"), std::string::npos) << topk_err;
  EXPECT_EQ(topk_err.find("--device cuda"), std::string::npos) << topk_err;
}

// A gradient clip that is negative or not a finite number is refused
// before anything trains, naming the field.
TEST(TrainCommandTest, RejectsABadGradientClipNamingTheField) {
  const Command* train = FindCommand("train");
  ASSERT_NE(train, nullptr);
  for (const char* bad : {"-1", "nan", "inf"}) {
    const std::string job_path =
        NowhereJob("clip.yaml", {{"seed: 2}", absl::StrCat("seed: 2, dense_grad_clip_norm: ", bad, "}")}});
    testing::internal::CaptureStderr();
    EXPECT_EQ(train->run({"--local", job_path}), kExitUsage) << bad;
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("spec.training.dense_grad_clip_norm must be a finite number >= 0"), std::string::npos)
        << bad << ": " << err;
  }
}

}  // namespace
}  // namespace recfleet::cli
