#include "common/process_memory.h"

#include <cstring>
#include <memory>

#include "gtest/gtest.h"

namespace recfleet {
namespace {

constexpr int64_t kMiB = 1 << 20;

TEST(ProcessMemoryTest, PeakFollowsTouchedMemoryAndRestartsAfterReset) {
  ASSERT_TRUE(ResetPeakResident().ok());
  absl::StatusOr<int64_t> before = ResidentBytes();
  ASSERT_TRUE(before.ok()) << before.status();
  {
    // Touched pages are resident; a large block is its own mapping, so the
    // free below gives it back at once.
    std::unique_ptr<char[]> block(new char[64 * kMiB]);
    std::memset(block.get(), 1, 64 * kMiB);
    absl::StatusOr<int64_t> now = ResidentBytes();
    ASSERT_TRUE(now.ok());
    EXPECT_GE(*now - *before, 63 * kMiB);
  }
  absl::StatusOr<int64_t> peak = PeakResidentBytes();
  ASSERT_TRUE(peak.ok());
  EXPECT_GE(*peak - *before, 63 * kMiB);
  EXPECT_LT(*peak - *before, 80 * kMiB);

  ASSERT_TRUE(ResetPeakResident().ok());
  absl::StatusOr<int64_t> restarted = PeakResidentBytes();
  ASSERT_TRUE(restarted.ok());
  EXPECT_LT(*restarted - *before, 16 * kMiB);
}

}  // namespace
}  // namespace recfleet
