#include "worker/gpu_selection.h"

#include "gtest/gtest.h"

namespace recfleet::worker {
namespace {

TEST(GpuSelectionTest, DefaultIsEveryGpuAndAListChoosesSome) {
  EXPECT_EQ(*SelectGpus("", 4), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(*SelectGpus("all", 2), (std::vector<int>{0, 1}));
  EXPECT_EQ(*SelectGpus("2,0", 4), (std::vector<int>{2, 0}));
  EXPECT_EQ(*SelectGpus(" 1 ", 2), (std::vector<int>{1}));
}

TEST(GpuSelectionTest, RefusesWhatTheHostDoesNotHave) {
  for (const char* bad : {"4", "-1", "x", "0,,1", "1,1"}) {
    absl::StatusOr<std::vector<int>> s = SelectGpus(bad, 4);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.status().message().find("--gpus"), std::string::npos) << s.status();
  }
}

TEST(GpuSelectionTest, ChildGetsOneGpuAndItsOwnWorkDir) {
  const std::vector<std::string> argv = {"recfleet-worker", "--device=cuda", "--gpus", "0,1",
                                         "--work_dir=/w", "--zone", "z1", "--gpus=all"};
  EXPECT_EQ(ChildCommandLine(argv, 1, "/w"),
            (std::vector<std::string>{"recfleet-worker", "--device=cuda", "--zone", "z1", "--gpus=1",
                                      "--work_dir=/w/gpu-1"}));
}

TEST(GpuSelectionTest, RegistrationCarriesTheGpuAndTopologyLabels) {
  v1::RegisterWorkerRequest r = GpuWorkerRegistration({"10.0.0.5", "", "", "hall-a"}, 3, "NVIDIA H200", int64_t{150} << 30);
  EXPECT_EQ(r.host(), "10.0.0.5");
  ASSERT_EQ(r.gpus_size(), 1);
  EXPECT_EQ(r.gpus(0).index(), 3);
  EXPECT_EQ(r.gpus(0).name(), "NVIDIA H200");
  EXPECT_EQ(r.gpus(0).memory_bytes(), int64_t{150} << 30);
  // Node and NVLink domain default to the host: the GPUs of one host share
  // a domain, so the scheduler keeps their heavy traffic together.
  EXPECT_EQ(r.topology().node(), "10.0.0.5");
  EXPECT_EQ(r.topology().nvlink_domain(), "10.0.0.5");
  EXPECT_EQ(r.topology().zone(), "hall-a");
  r = GpuWorkerRegistration({"10.0.0.5", "n7", "rack-3", ""}, 0, "NVIDIA H100", 80LL << 30);
  EXPECT_EQ(r.topology().node(), "n7");
  EXPECT_EQ(r.topology().nvlink_domain(), "rack-3");
}

}  // namespace
}  // namespace recfleet::worker
