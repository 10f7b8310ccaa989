// The CUDA bucketing byte-equal to the CPU one on fresh random shardings.

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/device_buffer.h"
#include "kernels/embedding/bucket.h"
#include "kernels/embedding/bucket_testing.h"

namespace recfleet {
namespace {

TensorView HostView(std::vector<int64_t>& v) {
  return MakeView(v.data(), DType::kInt64, {static_cast<int64_t>(v.size())});
}

TEST(BucketIdsByShardCudaTest, ByteEqualToCpu) {
  for (int iter = 0; iter < 200; ++iter) {
    SCOPED_TRACE(iter);
    // Up to 40 ranks: tables of more than 32 shards take several launches.
    const int group = iter % 10 == 0 ? 40 : 1 + iter % 6;
    const BucketCase c = RandomBucketCase(group, 1 + iter % 5, iter % 3 == 0);
    BucketResult cpu;
    cpu.lengths.assign(c.num_lengths, -1);
    cpu.routed.assign(c.num_routed, -1);
    cpu.counts.assign(c.num_counts, -1);
    ASSERT_TRUE(BucketIdsByShard(Bucketings(c,
                                            [](const std::vector<int64_t>& v) {
                                              return MakeView(const_cast<int64_t*>(v.data()), DType::kInt64,
                                                              {static_cast<int64_t>(v.size())});
                                            }),
                                 HostView(cpu.lengths), HostView(cpu.routed), HostView(cpu.counts))
                    .ok());
    std::vector<std::unique_ptr<DeviceBuffer>> inputs;
    auto on_gpu = [&](const std::vector<int64_t>& v) {
      inputs.push_back(std::make_unique<DeviceBuffer>(v));
      return inputs.back()->View(DType::kInt64, {static_cast<int64_t>(v.size())});
    };
    // Filled with a pattern the bucketing must overwrite.
    DeviceBuffer lengths(std::vector<int64_t>(c.num_lengths, -1)), routed(std::vector<int64_t>(c.num_routed, -1)),
        counts(std::vector<int64_t>(c.num_counts, -1));
    const absl::Status s = BucketIdsByShard(Bucketings(c, on_gpu), lengths.View(DType::kInt64, {c.num_lengths}),
                                            routed.View(DType::kInt64, {c.num_routed}),
                                            counts.View(DType::kInt64, {c.num_counts}));
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(lengths.ToHost<int64_t>(), cpu.lengths);
    EXPECT_EQ(routed.ToHost<int64_t>(), cpu.routed);
    EXPECT_EQ(counts.ToHost<int64_t>(), cpu.counts);

    std::vector<int64_t> offsets_cpu(c.num_lengths + 1);
    ASSERT_TRUE(OffsetsFromLengths(HostView(cpu.lengths), HostView(offsets_cpu)).ok());
    DeviceBuffer offsets((c.num_lengths + 1) * sizeof(int64_t));
    ASSERT_TRUE(OffsetsFromLengths(lengths.View(DType::kInt64, {c.num_lengths}),
                                   offsets.View(DType::kInt64, {c.num_lengths + 1}))
                    .ok());
    EXPECT_EQ(offsets.ToHost<int64_t>(), offsets_cpu);
  }
}

}  // namespace
}  // namespace recfleet
