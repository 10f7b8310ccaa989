#include "worker/rank_run.h"

#include <string>

#include "gtest/gtest.h"
#include "worker/comm/kv_store.h"

namespace recfleet::worker {
namespace {

class NullSink : public ProgressSink {
 public:
  void ReportStep(const v1::StepStats&) override {}
  void ReportEval(const v1::EvalStats&) override {}
  absl::Status Flush(bool) override { return absl::OkStatus(); }
};

// GPU ranks do not exchange gradients yet: a CUDA rank of a larger world is
// refused by name before it touches a device (so this holds on CPU-only
// machines too), instead of training a replica that silently diverges.
TEST(RankRunTest, CudaRankOfSeveralIsRefusedPlainly) {
  v1::Assignment a;
  a.set_job("jobs/gpu2");
  a.set_rank(1);
  a.set_world_size(2);
  a.set_restart_epoch(1);
  TrainingOptions options;
  options.device = Device::kCuda;
  TaskControl control("w");
  comm::InProcessKvStore store;
  NullSink sink;
  WorkerMetrics metrics;
  const absl::Status s = RunRank(a, control, store, sink, options, &metrics);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("CUDA ranks train a world of one only"), std::string::npos) << s;
  EXPECT_NE(s.message().find("gpus_per_worker = 1"), std::string::npos) << s;
}

}  // namespace
}  // namespace recfleet::worker
