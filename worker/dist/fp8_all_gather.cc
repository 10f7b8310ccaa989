#include "worker/dist/fp8_all_gather.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/quant/quantize.h"

namespace recfleet {
namespace dist {
namespace {

constexpr int64_t kCols = 32;  // Columns of the quantized view: 32x32 blocks are 1,024 consecutive elements.

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

}  // namespace

Fp8AllGather::SlotLayout Fp8AllGather::LayoutOf(const FlatShardLayout& layout, int rank,
                                                const std::vector<std::pair<int64_t, int64_t>>& fp8_ranges) {
  SlotLayout s;
  const int64_t first = layout.ShardOffset(rank), end = first + layout.shard_numel;
  int64_t at = first;
  for (const auto& [b, e] : fp8_ranges) {
    const int64_t lo = std::max(b, first), hi = std::min(e, end);
    if (lo >= hi) continue;
    if (at < lo) s.rest.push_back({at - first, lo - first});
    s.fp8.push_back({lo - first, hi - first});
    s.fp8_numel += hi - lo;
    at = hi;
  }
  if (at < end) s.rest.push_back({at - first, end - first});
  s.quantized_rows = s.fp8_numel / kCols;
  s.packed_bytes = s.quantized_rows > 0
                       ? RoundUp(static_cast<int64_t>(PackedBytes(s.quantized_rows, kCols, ScaleBlock::k32x32)), 16)
                       : 0;
  // fp32: the FP8 elements past the last whole row of 32, and the rest.
  s.bytes = s.packed_bytes + (layout.shard_numel - s.quantized_rows * kCols) * static_cast<int64_t>(sizeof(float));
  return s;
}

absl::StatusOr<Fp8AllGather> Fp8AllGather::Create(const FlatShardLayout& layout, comm::Communicator* group,
                                                  std::vector<std::pair<int64_t, int64_t>> fp8_ranges) {
  if (group == nullptr) return absl::InvalidArgumentError("fp8 all-gather: group is null");
  if (group->device() != Device::kCpu) {
    return absl::UnimplementedError("fp8 all-gather: host (Gloo) buffers only; a CUDA group gathers at full precision");
  }
  if (layout.padded_numel != layout.shard_numel * group->size()) {
    return absl::InvalidArgumentError(absl::StrCat("fp8 all-gather: layout of ", layout.padded_numel,
                                                   " elements is not ", group->size(), " shards of ", layout.shard_numel));
  }
  int64_t prev = 0;
  for (const auto& [b, e] : fp8_ranges) {
    if (b < prev || e < b || e > layout.numel) {
      return absl::InvalidArgumentError(absl::StrCat("fp8 all-gather: range [", b, ", ", e,
                                                     ") is unsorted, overlaps or lies outside the ", layout.numel,
                                                     " parameters"));
    }
    prev = e;
  }
  Fp8AllGather g(layout, group);
  int64_t largest = 0;
  for (int r = 0; r < group->size(); ++r) {
    g.slots_.push_back(LayoutOf(layout, r, fp8_ranges));
    g.fp8_numel_ += g.slots_.back().fp8_numel;
    largest = std::max(largest, g.slots_.back().bytes);
  }
  g.slot_bytes_ = std::max<int64_t>(16, RoundUp(largest, 16));
  g.send_.assign(g.slot_bytes_ / sizeof(int32_t), 0);
  g.received_.assign(g.send_.size() * group->size(), 0);
  return g;
}

absl::Status Fp8AllGather::Pack(const SlotLayout& slot, const float* shard, char* out) {
  staging_.resize(std::max<int64_t>(1, slot.fp8_numel));
  int64_t n = 0;
  for (const auto& [b, e] : slot.fp8) {
    std::copy(shard + b, shard + e, staging_.begin() + n);
    n += e - b;
  }
  const int64_t quantized = slot.quantized_rows * kCols;
  if (slot.quantized_rows > 0) {
    QuantizeConfig config;
    config.block = ScaleBlock::k32x32;
    config.format = DType::kFloat8E4M3;
    const TensorView x = MakeView(staging_.data(), DType::kFloat32, {slot.quantized_rows, kCols});
    if (absl::Status s = QuantizeAndPack(x, config, out); !s.ok()) return s;
  }
  char* tail = out + slot.packed_bytes;
  std::memcpy(tail, staging_.data() + quantized, (slot.fp8_numel - quantized) * sizeof(float));
  tail += (slot.fp8_numel - quantized) * sizeof(float);
  for (const auto& [b, e] : slot.rest) {
    std::memcpy(tail, shard + b, (e - b) * sizeof(float));
    tail += (e - b) * sizeof(float);
  }
  return absl::OkStatus();
}

absl::Status Fp8AllGather::Unpack(const SlotLayout& slot, const char* in, float* shard_out) {
  staging_.resize(std::max<int64_t>(1, slot.fp8_numel));
  const int64_t quantized = slot.quantized_rows * kCols;
  if (slot.quantized_rows > 0) {
    const Shape scale_shape = QuantScaleShape(slot.quantized_rows, kCols, ScaleBlock::k32x32);
    q_.resize(quantized);
    scales_.resize(scale_shape[0] * scale_shape[1]);
    const TensorView q = MakeView(q_.data(), DType::kFloat8E4M3, {slot.quantized_rows, kCols});
    const TensorView scales = MakeView(scales_.data(), DType::kFloat32, scale_shape);
    if (absl::Status s = UnpackQuantized(in, ScaleBlock::k32x32, q, scales); !s.ok()) return s;
    const TensorView x = MakeView(staging_.data(), DType::kFloat32, {slot.quantized_rows, kCols});
    if (absl::Status s = Dequantize(q, scales, ScaleBlock::k32x32, x); !s.ok()) return s;
  }
  const char* tail = in + slot.packed_bytes;
  std::memcpy(staging_.data() + quantized, tail, (slot.fp8_numel - quantized) * sizeof(float));
  tail += (slot.fp8_numel - quantized) * sizeof(float);
  int64_t n = 0;
  for (const auto& [b, e] : slot.fp8) {
    std::copy(staging_.begin() + n, staging_.begin() + n + (e - b), shard_out + b);
    n += e - b;
  }
  for (const auto& [b, e] : slot.rest) {
    std::memcpy(shard_out + b, tail, (e - b) * sizeof(float));
    tail += (e - b) * sizeof(float);
  }
  return absl::OkStatus();
}

absl::Status Fp8AllGather::AllGather(const TensorView& shard, const TensorView& full) {
  if (absl::Status s = CheckDim(shard, "fsdp shard", 0, layout_.shard_numel); !s.ok()) return s;
  if (absl::Status s = CheckDim(full, "fsdp full parameter", 0, layout_.padded_numel); !s.ok()) return s;
  if (shard.dtype != DType::kFloat32 || full.dtype != DType::kFloat32 || shard.device != Device::kCpu ||
      full.device != Device::kCpu) {
    return absl::InvalidArgumentError("fp8 all-gather: shard and full parameter must be fp32 host buffers");
  }
  const int rank = group_->rank();
  if (absl::Status s = Pack(slots_[rank], shard.as<float>(), reinterpret_cast<char*>(send_.data())); !s.ok()) {
    return s;
  }
  const int64_t words = static_cast<int64_t>(send_.size());
  if (absl::Status s = group_->AllGather(MakeView(send_.data(), DType::kInt32, {words}),
                                         MakeView(received_.data(), DType::kInt32, {words * group_->size()}));
      !s.ok()) {
    return s;
  }
  float* out = full.as<float>();
  for (int r = 0; r < group_->size(); ++r) {
    if (absl::Status s = Unpack(slots_[r], reinterpret_cast<const char*>(received_.data() + r * words),
                                out + layout_.ShardOffset(r));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace dist
}  // namespace recfleet
