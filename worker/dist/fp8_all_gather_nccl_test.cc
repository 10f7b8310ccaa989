// The FP8 all-gather over NCCL (tag "gpu"): on CUDA buffers it gives the
// same bits as on host buffers over Gloo (the quantization kernels are
// bit-identical), with one rank and, when there are at least two GPUs, one
// rank per GPU; the bytes each rank hands to ncclAllGather are counted, and
// the call is timed against the fp32 gather of the same buffer (printed;
// bench/RESULTS.md records them).

#include <cstdio>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/cuda_test_memory.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/testing.h"
#include "worker/dist/fp8_all_gather_testing.h"

namespace recfleet {
namespace dist {
namespace {

comm::CommFactory NcclOnDevice(int device) {
  return [device](comm::KvStore& s, int r, int n) { return comm::ConnectNccl(s, r, n, device, comm::CommOptions()); };
}

// Ranges that cut shards and 32-element rows anywhere.
const std::vector<std::pair<int64_t, int64_t>> kRanges = {{5, 2'300}, {2'300, 2'333}, {4'000, 9'990}};

void SameBitsAsGloo(int group) {
  const std::vector<float> params = WeightLikeParameters(10'007, 3);
  comm::CudaTestMemory gpu;
  comm::HostTestMemory host;
  const Gathered on_gpu = GatherOnRanks(group, params, kRanges, true, gpu, NcclOnDevice);
  const Gathered on_host = GatherOnRanks(group, params, kRanges, true, host, [](int) { return comm::LoopbackGloo(); });
  // Started (FSDP prefetch's form): the unpack is queued behind the gather.
  const Gathered started = GatherOnRanks(group, params, kRanges, true, gpu, NcclOnDevice, 0, /*started=*/true);
  int64_t rounded = 0;
  for (int r = 0; r < group; ++r) {
    ASSERT_EQ(on_gpu.full[r], on_host.full[0]) << "rank " << r;
    ASSERT_EQ(started.full[r], on_host.full[0]) << "rank " << r << ", started";
    EXPECT_EQ(on_gpu.bytes[r], on_host.bytes[r]);
  }
  for (size_t i = 0; i < params.size(); ++i) rounded += on_gpu.full[0][i] != params[i];
  EXPECT_GT(rounded, 1000);  // The ranges did travel as FP8.
  EXPECT_EQ(on_gpu.fp8_numel, (2'333 - 5) + (9'990 - 4'000));
}

TEST(Fp8AllGatherNcclTest, OneGpuGivesGloosBits) {
  ASSERT_GE(comm::CudaDeviceCount(), 1) << "this test needs a GPU";
  SameBitsAsGloo(1);
}

TEST(Fp8AllGatherNcclTest, EveryGpuGivesGloosBits) {
  const int gpus = comm::CudaDeviceCount();
  if (gpus < 2) GTEST_SKIP() << "needs at least 2 GPUs, have " << gpus;
  SameBitsAsGloo(gpus);
}

// Every GPU one rank; 64 Mi parameters, all FP8 (a dense model's weight
// matrices): the bytes handed to ncclAllGather are ~1/4 of fp32's (~1/2 of
// bf16's), and the call's time is printed beside the fp32 gather's.
TEST(Fp8AllGatherNcclTest, BytesAndTimeAgainstFp32) {
  const int gpus = comm::CudaDeviceCount();
  ASSERT_GE(gpus, 1) << "this test needs a GPU";
  const int64_t n = int64_t{64} << 20;
  const std::vector<float> params = WeightLikeParameters(n, 4);
  comm::CudaTestMemory gpu;
  constexpr int kTimed = 9;
  const Gathered fp32 = GatherOnRanks(gpus, params, {}, false, gpu, NcclOnDevice, kTimed);
  const Gathered fp8 = GatherOnRanks(gpus, params, {{0, n}}, true, gpu, NcclOnDevice, kTimed);
  const double shard = static_cast<double>(n) / gpus;
  std::printf("ranks %d, %lld parameters: bytes per rank fp32 %lld, fp8 %lld (%.4fx fp32, %.4fx bf16); "
              "median call fp32 %.3f ms, fp8 %.3f ms (quantize + pack + gather + unpack + dequantize)\n",
              gpus, static_cast<long long>(n), static_cast<long long>(fp32.bytes[0]),
              static_cast<long long>(fp8.bytes[0]), fp8.bytes[0] / (4 * shard), fp8.bytes[0] / (2 * shard),
              fp32.seconds * 1e3, fp8.seconds * 1e3);
  EXPECT_LE(fp8.bytes[0], 0.25 * (1 + 1.0 / 1024) * 4 * shard + 16);
  for (int r = 0; r < gpus; ++r) ASSERT_EQ(fp8.full[r], fp8.full[0]) << "rank " << r;
}

}  // namespace
}  // namespace dist
}  // namespace recfleet
