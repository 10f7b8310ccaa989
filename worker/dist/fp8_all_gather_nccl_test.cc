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

// Matrices with partial edge tiles, cut by the shards mid-row and mid-tile.
const std::vector<Fp8Matrix> kMatrices = {{5, 45, 51}, {2'300, 1, 33}, {4'000, 30, 199}};

void SameBitsAsGloo(int group) {
  const std::vector<float> params = WeightLikeParameters(10'007, 3);
  comm::CudaTestMemory gpu;
  comm::HostTestMemory host;
  const Gathered on_gpu = GatherOnRanks(group, params, kMatrices, true, gpu, NcclOnDevice);
  const Gathered on_host = GatherOnRanks(group, params, kMatrices, true, host, [](int) { return comm::LoopbackGloo(); });
  // Started (FSDP prefetch's form): the unpack is queued behind the gather.
  const Gathered started = GatherOnRanks(group, params, kMatrices, true, gpu, NcclOnDevice, 0, /*started=*/true);
  int64_t rounded = 0;
  for (int r = 0; r < group; ++r) {
    ASSERT_EQ(on_gpu.full[r], on_host.full[0]) << "rank " << r;
    ASSERT_EQ(started.full[r], on_host.full[0]) << "rank " << r << ", started";
    EXPECT_EQ(on_gpu.codes[r], on_host.codes[0]) << "rank " << r << ", kept codes";
    EXPECT_EQ(on_gpu.tile_scales[r], on_host.tile_scales[0]) << "rank " << r << ", kept tile scales";
    EXPECT_EQ(started.codes[r], on_host.codes[0]) << "rank " << r << ", started, kept codes";
    EXPECT_EQ(on_gpu.bytes[r], on_host.bytes[r]);
    EXPECT_EQ(on_gpu.reduce_bytes[r], on_host.reduce_bytes[r]);
  }
  std::vector<float> want = QuantizedLikeTheGemms(params, kMatrices);
  want.resize(on_host.full[0].size(), 0.0f);
  ASSERT_EQ(on_host.full[0], want) << "not the GEMMs' quantization of the whole matrices";
  for (size_t i = 0; i < params.size(); ++i) rounded += on_gpu.full[0][i] != params[i];
  EXPECT_GT(rounded, 1000);  // The matrices did travel as FP8.
  EXPECT_EQ(on_gpu.fp8_numel, 45 * 51 + 33 + 30 * 199);
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

// Every GPU one rank; 64 Mi parameters, all FP8 (an 8,192 x 8,192 weight):
// the bytes handed to ncclAllGather are ~1/4 of fp32's (~1/2 of bf16's),
// plus 16 KiB of tile maxima all-reduced first, and the call's time is
// printed beside the fp32 gather's.
TEST(Fp8AllGatherNcclTest, BytesAndTimeAgainstFp32) {
  const int gpus = comm::CudaDeviceCount();
  ASSERT_GE(gpus, 1) << "this test needs a GPU";
  const int64_t n = int64_t{64} << 20;
  const std::vector<float> params = WeightLikeParameters(n, 4);
  comm::CudaTestMemory gpu;
  constexpr int kTimed = 9;
  const Gathered fp32 = GatherOnRanks(gpus, params, {}, false, gpu, NcclOnDevice, kTimed);
  const Gathered fp8 = GatherOnRanks(gpus, params, {{0, 8192, 8192}}, true, gpu, NcclOnDevice, kTimed);
  const double shard = static_cast<double>(n) / gpus;
  std::printf("ranks %d, %lld parameters: bytes per rank fp32 %lld, fp8 %lld (%.4fx fp32, %.4fx bf16); "
              "tile maxima %lld; median call fp32 %.3f ms, fp8 %.3f ms (maxima + all-reduce + quantize + gather + "
              "dequantize + keeping the codes)\n",
              gpus, static_cast<long long>(n), static_cast<long long>(fp32.bytes[0]),
              static_cast<long long>(fp8.bytes[0]), fp8.bytes[0] / (4 * shard), fp8.bytes[0] / (2 * shard),
              static_cast<long long>(fp8.reduce_bytes[0]), fp32.seconds * 1e3, fp8.seconds * 1e3);
  EXPECT_LE(fp8.bytes[0], shard + 16);
  EXPECT_EQ(fp8.reduce_bytes[0], 64 * 64 * 4);
  for (int r = 0; r < gpus; ++r) ASSERT_EQ(fp8.full[r], fp8.full[0]) << "rank " << r;
}

}  // namespace
}  // namespace dist
}  // namespace recfleet
