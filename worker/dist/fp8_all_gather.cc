#include "worker/dist/fp8_all_gather.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>

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
  int64_t largest = 0, largest_fp8 = 1, largest_rows = 0;
  for (int r = 0; r < group->size(); ++r) {
    g.slots_.push_back(LayoutOf(layout, r, fp8_ranges));
    const SlotLayout& slot = g.slots_.back();
    g.fp8_numel_ += slot.fp8_numel;
    largest = std::max(largest, slot.bytes);
    largest_fp8 = std::max(largest_fp8, slot.fp8_numel);
    largest_rows = std::max(largest_rows, slot.quantized_rows);
  }
  g.slot_bytes_ = std::max<int64_t>(16, RoundUp(largest, 16));
  const Device device = group->device();
  const Shape scale_shape = QuantScaleShape(std::max<int64_t>(1, largest_rows), kCols, ScaleBlock::k32x32);
  for (const auto& [buffer, bytes] : std::vector<std::pair<DeviceBuffer*, int64_t>>{
           {&g.staging_, largest_fp8 * static_cast<int64_t>(sizeof(float))},
           {&g.send_, g.slot_bytes_},
           {&g.received_, g.slot_bytes_ * group->size()},
           {&g.q_, std::max<int64_t>(1, largest_rows) * kCols},
           {&g.scales_, scale_shape[0] * scale_shape[1] * static_cast<int64_t>(sizeof(float))}}) {
    absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Zeros(device, static_cast<size_t>(bytes));
    if (!b.ok()) return b.status();
    *buffer = *std::move(b);
  }
  return g;
}

absl::Status Fp8AllGather::CopyFloats(float* dst, const float* src, int64_t n) const {
  if (n == 0) return absl::OkStatus();
  return CopyOnDevice(group_->device(), dst, src, static_cast<size_t>(n) * sizeof(float));
}

absl::Status Fp8AllGather::Pack(const SlotLayout& slot, const float* shard, char* out) {
  const Device device = group_->device();
  // The FP8 elements in one run: straight from the shard when they are one
  // range, else gathered into staging_.
  float* staging = static_cast<float*>(staging_.data());
  const float* fp8 = slot.fp8.size() == 1 ? shard + slot.fp8[0].first : staging;
  int64_t n = 0;
  for (const auto& [b, e] : slot.fp8) {
    if (fp8 != staging) break;
    if (absl::Status s = CopyFloats(staging + n, shard + b, e - b); !s.ok()) return s;
    n += e - b;
  }
  const int64_t quantized = slot.quantized_rows * kCols;
  if (slot.quantized_rows > 0) {
    QuantizeConfig config;
    config.block = ScaleBlock::k32x32;
    config.format = DType::kFloat8E4M3;
    const TensorView x = MakeView(const_cast<float*>(fp8), DType::kFloat32, {slot.quantized_rows, kCols}, device);
    if (absl::Status s = QuantizeAndPack(x, config, out); !s.ok()) return s;
  }
  float* tail = reinterpret_cast<float*>(out + slot.packed_bytes);
  if (absl::Status s = CopyFloats(tail, fp8 + quantized, slot.fp8_numel - quantized); !s.ok()) return s;
  tail += slot.fp8_numel - quantized;
  for (const auto& [b, e] : slot.rest) {
    if (absl::Status s = CopyFloats(tail, shard + b, e - b); !s.ok()) return s;
    tail += e - b;
  }
  return absl::OkStatus();
}

absl::Status Fp8AllGather::Unpack(const SlotLayout& slot, const char* in, float* shard_out) {
  const Device device = group_->device();
  // Straight into place when the FP8 elements are one range, else through
  // staging_.
  float* staging = static_cast<float*>(staging_.data());
  float* fp8 = slot.fp8.size() == 1 ? shard_out + slot.fp8[0].first : staging;
  const int64_t quantized = slot.quantized_rows * kCols;
  if (slot.quantized_rows > 0) {
    const TensorView q = q_.View(DType::kFloat8E4M3, {slot.quantized_rows, kCols});
    const TensorView scales =
        scales_.View(DType::kFloat32, QuantScaleShape(slot.quantized_rows, kCols, ScaleBlock::k32x32));
    if (absl::Status s = UnpackQuantized(in, ScaleBlock::k32x32, q, scales); !s.ok()) return s;
    const TensorView x = MakeView(fp8, DType::kFloat32, {slot.quantized_rows, kCols}, device);
    if (absl::Status s = Dequantize(q, scales, ScaleBlock::k32x32, x); !s.ok()) return s;
  }
  const float* tail = reinterpret_cast<const float*>(in + slot.packed_bytes);
  if (absl::Status s = CopyFloats(fp8 + quantized, tail, slot.fp8_numel - quantized); !s.ok()) return s;
  tail += slot.fp8_numel - quantized;
  int64_t n = 0;
  for (const auto& [b, e] : slot.fp8) {
    if (fp8 != staging) break;
    if (absl::Status s = CopyFloats(shard_out + b, staging + n, e - b); !s.ok()) return s;
    n += e - b;
  }
  for (const auto& [b, e] : slot.rest) {
    if (absl::Status s = CopyFloats(shard_out + b, tail, e - b); !s.ok()) return s;
    tail += e - b;
  }
  return absl::OkStatus();
}

absl::Status Fp8AllGather::CheckAndPack(const TensorView& shard, const TensorView& full) {
  if (absl::Status s = CheckDim(shard, "fsdp shard", 0, layout_.shard_numel); !s.ok()) return s;
  if (absl::Status s = CheckDim(full, "fsdp full parameter", 0, layout_.padded_numel); !s.ok()) return s;
  const Device device = group_->device();
  if (shard.dtype != DType::kFloat32 || full.dtype != DType::kFloat32 || shard.device != device ||
      full.device != device) {
    return absl::InvalidArgumentError(absl::StrCat("fp8 all-gather: shard and full parameter must be fp32 ",
                                                   device == Device::kCuda ? "CUDA" : "host",
                                                   " buffers, the group's device"));
  }
  return Pack(slots_[group_->rank()], shard.as<float>(), static_cast<char*>(send_.data()));
}

absl::Status Fp8AllGather::UnpackAll(const TensorView& full) {
  float* out = full.as<float>();
  const char* received = static_cast<const char*>(received_.data());
  for (int r = 0; r < group_->size(); ++r) {
    if (absl::Status s = Unpack(slots_[r], received + r * slot_bytes_, out + layout_.ShardOffset(r)); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Fp8AllGather::AllGather(const TensorView& shard, const TensorView& full) {
  if (absl::Status s = CheckAndPack(shard, full); !s.ok()) return s;
  const int64_t words = slot_bytes_ / static_cast<int64_t>(sizeof(int32_t));
  if (absl::Status s = group_->AllGather(send_.View(DType::kInt32, {words}),
                                         received_.View(DType::kInt32, {words * group_->size()}));
      !s.ok()) {
    return s;
  }
  return UnpackAll(full);
}

namespace {

// A started FP8 gather: the collective's handle, and the unpack that
// follows it once, when the caller makes it ready or waits for it.
class StartedFp8Gather : public comm::PendingCollective {
 public:
  StartedFp8Gather(std::unique_ptr<comm::PendingCollective> gather, std::function<absl::Status()> unpack)
      : gather_(std::move(gather)), unpack_(std::move(unpack)) {}
  absl::Status Ready() override { return Then(gather_->Ready()); }
  absl::Status Wait() override {
    if (absl::Status s = Then(gather_->Wait()); !s.ok()) return s;
    // On CUDA the unpack was only queued: wait for it as well.
    return SynchronizeDevice(device_);
  }
  void set_device(Device device) { device_ = device; }

 private:
  absl::Status Then(absl::Status gathered) {
    if (!gathered.ok() || unpacked_) return gathered;
    unpacked_ = true;
    return unpack_();
  }
  std::unique_ptr<comm::PendingCollective> gather_;
  std::function<absl::Status()> unpack_;
  bool unpacked_ = false;
  Device device_ = Device::kCpu;
};

}  // namespace

absl::StatusOr<std::unique_ptr<comm::PendingCollective>> Fp8AllGather::StartAllGather(const TensorView& shard,
                                                                                       const TensorView& full) {
  if (absl::Status s = CheckAndPack(shard, full); !s.ok()) return s;
  const int64_t words = slot_bytes_ / static_cast<int64_t>(sizeof(int32_t));
  absl::StatusOr<std::unique_ptr<comm::PendingCollective>> started = group_->StartAllGather(
      send_.View(DType::kInt32, {words}), received_.View(DType::kInt32, {words * group_->size()}));
  if (!started.ok()) return started.status();
  auto handle = std::make_unique<StartedFp8Gather>(*std::move(started), [this, full] { return UnpackAll(full); });
  handle->set_device(group_->device());
  return handle;
}

}  // namespace dist
}  // namespace recfleet
