#include "worker/dist/fp8_all_gather_testing.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <random>

#include "gtest/gtest.h"
#include "kernels/quant/quantize.h"
#include "worker/comm/kv_store.h"
#include "worker/comm/testing.h"
#include "worker/dist/device_buffer.h"
#include "worker/dist/fp8_all_gather.h"
#include "worker/dist/fsdp.h"

namespace recfleet {
namespace dist {

absl::Status CountingCommunicator::DoAllGather(const TensorView& in, const TensorView& out) {
  all_gather_bytes += static_cast<int64_t>(in.nbytes());
  return inner_->AllGather(in, out);
}
absl::Status CountingCommunicator::DoReduceScatter(const TensorView& in, const TensorView& out, comm::ReduceOp op) {
  return inner_->ReduceScatter(in, out, op);
}
absl::Status CountingCommunicator::DoAllReduce(const TensorView& inout, comm::ReduceOp op) {
  all_reduce_bytes += static_cast<int64_t>(inout.nbytes());
  return inner_->AllReduce(inout, op);
}
absl::Status CountingCommunicator::DoAllToAll(const TensorView& in, absl::Span<const int64_t> send_counts,
                                              const TensorView& out, absl::Span<const int64_t> recv_counts) {
  return inner_->AllToAll(in, send_counts, out, recv_counts);
}
absl::Status CountingCommunicator::DoBroadcast(const TensorView& inout, int root) {
  return inner_->Broadcast(inout, root);
}
absl::Status CountingCommunicator::DoBarrier() { return inner_->Barrier(); }

std::vector<float> WeightLikeParameters(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = normal(rng) * std::ldexp(1.0f, -static_cast<int>((i / 700) % 6));
  for (int64_t i = 0; i < n; i += 97) v[i] = 0.0f;
  return v;
}

std::vector<float> QuantizedLikeTheGemms(std::vector<float> params, const std::vector<Fp8Matrix>& matrices,
                                         std::vector<std::vector<uint8_t>>* codes,
                                         std::vector<std::vector<float>>* scales_out) {
  const QuantizeConfig config{ScaleBlock::k128x128, DType::kFloat8E4M3, Rounding::kNearest, 0};
  for (const Fp8Matrix& m : matrices) {
    const Shape shape = {m.rows, m.cols}, scale_shape = QuantScaleShape(m.rows, m.cols, ScaleBlock::k128x128);
    std::vector<uint8_t> q(m.rows * m.cols);
    std::vector<float> scales(scale_shape[0] * scale_shape[1]);
    const TensorView w = MakeView(params.data() + m.begin, DType::kFloat32, shape);
    const TensorView qv = MakeView(q.data(), DType::kFloat8E4M3, shape);
    const TensorView sv = MakeView(scales.data(), DType::kFloat32, scale_shape);
    EXPECT_TRUE(Quantize(w, config, false, qv, sv).ok());
    EXPECT_TRUE(Dequantize(qv, sv, ScaleBlock::k128x128, w).ok());
    if (codes != nullptr) codes->push_back(q);
    if (scales_out != nullptr) scales_out->push_back(scales);
  }
  return params;
}

Gathered GatherOnRanks(int group, const std::vector<float>& params,
                       const std::vector<Fp8Matrix>& fp8_matrices, bool fp8,
                       comm::TestMemory& memory, const std::function<comm::CommFactory(int rank)>& factory_for_rank,
                       int timed, bool started) {
  comm::InProcessKvStore store;
  const FlatShardLayout layout = FlatShardLayout::Make(static_cast<int64_t>(params.size()), group);
  std::vector<float> padded = params;
  padded.resize(layout.padded_numel, 0.0f);
  Gathered out;
  out.full.assign(group, std::vector<float>(layout.padded_numel));
  out.bytes.assign(group, 0);
  out.reduce_bytes.assign(group, 0);
  if (fp8) {
    out.codes.resize(group);
    out.tile_scales.resize(group);
  }
  comm::RunOnThreads(group, [&](int r) {
    const size_t shard_bytes = layout.shard_numel * sizeof(float), full_bytes = layout.padded_numel * sizeof(float);
    void* shard = memory.Alloc(r, shard_bytes);
    void* full = memory.Alloc(r, full_bytes);
    memory.Upload(r, shard, padded.data() + layout.ShardOffset(r), shard_bytes);
    absl::StatusOr<std::unique_ptr<comm::Communicator>> inner = factory_for_rank(r)(store, r, group);
    ASSERT_TRUE(inner.ok()) << inner.status();
    CountingCommunicator counting(inner->get());
    const TensorView shard_view = MakeView(shard, DType::kFloat32, {layout.shard_numel}, memory.device());
    const TensorView full_view = MakeView(full, DType::kFloat32, {layout.padded_numel}, memory.device());
    std::optional<Fp8AllGather> fp8_gather;
    std::optional<FsdpFlatParameter> fsdp;
    if (fp8) {
      auto g = Fp8AllGather::Create(layout, &counting, fp8_matrices, /*keep_codes=*/true);
      ASSERT_TRUE(g.ok()) << g.status();
      fp8_gather.emplace(*std::move(g));
    } else {
      auto f = FsdpFlatParameter::Create(layout.numel, &counting, nullptr);
      ASSERT_TRUE(f.ok()) << f.status();
      fsdp.emplace(*std::move(f));
    }
    auto gather = [&]() -> absl::Status {
      if (!started) return fp8 ? fp8_gather->AllGather(shard_view, full_view) : fsdp->AllGather(shard_view, full_view);
      absl::StatusOr<std::unique_ptr<comm::PendingCollective>> handle =
          fp8 ? fp8_gather->StartAllGather(shard_view, full_view) : fsdp->StartAllGather(shard_view, full_view);
      if (!handle.ok()) return handle.status();
      return (*handle)->Ready();
    };
    absl::Status s = gather();
    ASSERT_TRUE(s.ok()) << s;
    out.bytes[r] = counting.all_gather_bytes;
    out.reduce_bytes[r] = counting.all_reduce_bytes;
    ASSERT_TRUE(SynchronizeDevice(memory.device()).ok());
    memory.Download(r, out.full[r].data(), full, full_bytes);
    if (fp8) {
      for (size_t i = 0; i < fp8_matrices.size(); ++i) {
        const TensorView c = fp8_gather->codes(static_cast<int>(i)), t = fp8_gather->tile_scales(static_cast<int>(i));
        out.codes[r].emplace_back(c.numel());
        out.tile_scales[r].emplace_back(t.numel());
        memory.Download(r, out.codes[r].back().data(), c.data, c.nbytes());
        memory.Download(r, out.tile_scales[r].back().data(), t.data, t.nbytes());
      }
    }
    if (r == 0 && fp8) {
      out.slot_bytes = fp8_gather->slot_bytes();
      out.fp8_numel = fp8_gather->fp8_numel();
    }
    std::vector<double> seconds;
    for (int i = 0; i < timed; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      s = gather();
      ASSERT_TRUE(s.ok()) << s;
      ASSERT_TRUE(SynchronizeDevice(memory.device()).ok());
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    if (r == 0 && !seconds.empty()) {
      std::sort(seconds.begin(), seconds.end());
      out.seconds = seconds[seconds.size() / 2];
    }
    memory.Free(r, shard);
    memory.Free(r, full);
  });
  return out;
}

}  // namespace dist
}  // namespace recfleet
