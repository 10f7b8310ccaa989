// Acceptance: 4 Gloo ranks (FSDP 2 x replicas 2, embedding tables sharded
// over 2) end 20 steps with the same parameters as one rank on the same
// global batches (relative error < 1e-5 in fp32). See equivalence_testing.h.

#include "gtest/gtest.h"
#include "worker/comm/testing.h"
#include "worker/dist/equivalence_testing.h"

namespace recfleet {
namespace dist {
namespace {

comm::CommFactory Gloo(int) { return comm::LoopbackGloo(); }

class EquivalenceTest : public ::testing::TestWithParam<DenseOptimizer> {};

TEST_P(EquivalenceTest, FourRanksMatchOneRankAfterTwentySteps) {
  comm::HostTestMemory memory;
  CheckDistributedEquivalence(4, 2, GetParam(), memory, Gloo);
}

INSTANTIATE_TEST_SUITE_P(DenseOptimizers, EquivalenceTest,
                         ::testing::Values(DenseOptimizer::kSgd, DenseOptimizer::kAdam),
                         [](const ::testing::TestParamInfo<DenseOptimizer>& info) {
                           return info.param == DenseOptimizer::kSgd ? "Sgd" : "Adam";
                         });

// Tables over 3 ranks without replicas, and 6 ranks as 3 replicas of 2.
TEST(EquivalenceTest, OtherLayoutsMatchOneRank) {
  comm::HostTestMemory memory;
  CheckDistributedEquivalence(3, 3, DenseOptimizer::kAdam, memory, Gloo);
  CheckDistributedEquivalence(6, 2, DenseOptimizer::kAdam, memory, Gloo);
}

}  // namespace
}  // namespace dist
}  // namespace recfleet
