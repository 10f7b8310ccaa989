#include "worker/dist/fp8_all_gather.h"

#include <algorithm>
#include <functional>
#include <memory>

#include "absl/strings/str_cat.h"

namespace recfleet {
namespace dist {
namespace {

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

}  // namespace

Fp8AllGather::SlotLayout Fp8AllGather::LayoutOf(const FlatShardLayout& layout, int rank,
                                                const std::vector<Fp8Matrix>& matrices,
                                                const std::vector<int64_t>& first_tiles) {
  SlotLayout s;
  const int64_t first = layout.ShardOffset(rank), end = first + layout.shard_numel;
  int64_t at = first;
  for (size_t m = 0; m < matrices.size(); ++m) {
    const Fp8Matrix& w = matrices[m];
    const int64_t lo = std::max(w.begin, first), hi = std::min(w.end(), end);
    if (lo >= hi) continue;
    if (at < lo) s.rest.push_back({at - first, lo - first});
    s.pieces.push_back({lo - first, TiledPiece{hi - lo, lo - w.begin, w.cols, first_tiles[m]}});
    s.piece_matrix.push_back(static_cast<int>(m));
    s.fp8_numel += hi - lo;
    at = hi;
  }
  if (at < end) s.rest.push_back({at - first, end - first});
  s.fp8_bytes = RoundUp(s.fp8_numel, 16);
  s.bytes = s.fp8_bytes + (layout.shard_numel - s.fp8_numel) * static_cast<int64_t>(sizeof(float));
  return s;
}

absl::StatusOr<Fp8AllGather> Fp8AllGather::Create(const FlatShardLayout& layout, comm::Communicator* group,
                                                  std::vector<Fp8Matrix> matrices, bool keep_codes) {
  if (group == nullptr) return absl::InvalidArgumentError("fp8 all-gather: group is null");
  if (layout.padded_numel != layout.shard_numel * group->size()) {
    return absl::InvalidArgumentError(absl::StrCat("fp8 all-gather: layout of ", layout.padded_numel,
                                                   " elements is not ", group->size(), " shards of ", layout.shard_numel));
  }
  int64_t prev = 0;
  for (const Fp8Matrix& w : matrices) {
    if (w.rows < 1 || w.cols < 1 || w.begin < prev || w.end() > layout.numel) {
      return absl::InvalidArgumentError(absl::StrCat("fp8 all-gather: matrix [", w.rows, ", ", w.cols, "] at ", w.begin,
                                                     " is empty, unsorted, overlaps another or lies outside the ",
                                                     layout.numel, " parameters"));
    }
    prev = w.end();
  }
  Fp8AllGather g(layout, group);
  int64_t code_bytes = 0;
  for (const Fp8Matrix& w : matrices) {
    g.first_tiles_.push_back(g.tiles_);
    g.tiles_ += TileCount(w.rows, w.cols);
    g.code_offsets_.push_back(code_bytes);
    code_bytes += RoundUp(w.rows * w.cols, 16);
  }
  int64_t largest = 0;
  for (int r = 0; r < group->size(); ++r) {
    g.slots_.push_back(LayoutOf(layout, r, matrices, g.first_tiles_));
    g.fp8_numel_ += g.slots_.back().fp8_numel;
    largest = std::max(largest, g.slots_.back().bytes);
  }
  g.slot_bytes_ = std::max<int64_t>(16, RoundUp(largest, 16));
  const Device device = group->device();
  const int64_t tile_bytes = std::max<int64_t>(1, g.tiles_) * static_cast<int64_t>(sizeof(float));
  for (const auto& [buffer, bytes] : std::vector<std::pair<DeviceBuffer*, int64_t>>{
           {&g.send_, g.slot_bytes_},
           {&g.received_, g.slot_bytes_ * group->size()},
           {&g.amax_, tile_bytes},
           {&g.scales_, tile_bytes}}) {
    absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Zeros(device, static_cast<size_t>(bytes));
    if (!b.ok()) return b.status();
    *buffer = *std::move(b);
  }
  if (keep_codes && code_bytes > 0) {
    absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Zeros(device, static_cast<size_t>(code_bytes));
    if (!b.ok()) return b.status();
    g.codes_ = *std::move(b);
  }
  g.matrices_ = std::move(matrices);
  return g;
}

TensorView Fp8AllGather::codes(int i) const {
  if (codes_.data() == nullptr) return TensorView();
  const Fp8Matrix& w = matrices_[i];
  return MakeView(static_cast<char*>(codes_.data()) + code_offsets_[i], DType::kFloat8E4M3,
                  {w.rows, w.cols}, group_->device());
}

TensorView Fp8AllGather::tile_scales(int i) const {
  if (codes_.data() == nullptr) return TensorView();
  const Fp8Matrix& w = matrices_[i];
  return MakeView(static_cast<float*>(scales_.data()) + first_tiles_[i], DType::kFloat32,
                  {TileCount(w.rows, w.cols)}, group_->device());
}

absl::Status Fp8AllGather::CopyFloats(float* dst, const float* src, int64_t n) const {
  if (n == 0) return absl::OkStatus();
  return CopyOnDevice(group_->device(), dst, src, static_cast<size_t>(n) * sizeof(float));
}

absl::StatusOr<std::unique_ptr<comm::PendingCollective>> Fp8AllGather::CheckAndPack(const TensorView& shard,
                                                                                     const TensorView& full,
                                                                                     bool started) {
  if (absl::Status s = CheckDim(shard, "fsdp shard", 0, layout_.shard_numel); !s.ok()) return s;
  if (absl::Status s = CheckDim(full, "fsdp full parameter", 0, layout_.padded_numel); !s.ok()) return s;
  const Device device = group_->device();
  if (shard.dtype != DType::kFloat32 || full.dtype != DType::kFloat32 || shard.device != device ||
      full.device != device) {
    return absl::InvalidArgumentError(absl::StrCat("fp8 all-gather: shard and full parameter must be fp32 ",
                                                   device == Device::kCuda ? "CUDA" : "host",
                                                   " buffers, the group's device"));
  }
  const SlotLayout& slot = slots_[group_->rank()];
  const float* x = shard.as<float>();
  std::unique_ptr<comm::PendingCollective> reduce;
  if (tiles_ > 0) {
    // Every tile's maximum over the group, then its scale.
    if (absl::Status s = ZeroOnDevice(device, amax_.data(), amax_bytes()); !s.ok()) return s;
    for (const auto& [b, piece] : slot.pieces) {
      const TensorView xv = MakeView(const_cast<float*>(x) + b, DType::kFloat32, {piece.numel}, device);
      if (absl::Status s = TiledPieceAmax(xv, piece, Tiles(amax_)); !s.ok()) return s;
    }
    if (started) {
      absl::StatusOr<std::unique_ptr<comm::PendingCollective>> r =
          group_->StartAllReduce(Tiles(amax_), comm::ReduceOp::kMax);
      if (!r.ok()) return r.status();
      reduce = *std::move(r);
      if (absl::Status s = reduce->Ready(); !s.ok()) return s;
    } else if (absl::Status s = group_->AllReduce(Tiles(amax_), comm::ReduceOp::kMax); !s.ok()) {
      return s;
    }
    if (absl::Status s = TileScalesFromAmax(Tiles(amax_), DType::kFloat8E4M3, Tiles(scales_)); !s.ok()) return s;
  }
  char* out = static_cast<char*>(send_.data());
  int64_t at = 0;
  for (const auto& [b, piece] : slot.pieces) {
    const TensorView xv = MakeView(const_cast<float*>(x) + b, DType::kFloat32, {piece.numel}, device);
    const TensorView qv = MakeView(out + at, DType::kFloat8E4M3, {piece.numel}, device);
    if (absl::Status s = QuantizeTiledPiece(xv, piece, Tiles(scales_), qv); !s.ok()) return s;
    at += piece.numel;
  }
  float* tail = reinterpret_cast<float*>(out + slot.fp8_bytes);
  for (const auto& [b, e] : slot.rest) {
    if (absl::Status s = CopyFloats(tail, x + b, e - b); !s.ok()) return s;
    tail += e - b;
  }
  return reduce;
}

absl::Status Fp8AllGather::UnpackAll(const TensorView& full) {
  const Device device = group_->device();
  const char* received = static_cast<const char*>(received_.data());
  for (int r = 0; r < group_->size(); ++r) {
    const SlotLayout& slot = slots_[r];
    const char* in = received + r * slot_bytes_;
    float* out = full.as<float>() + layout_.ShardOffset(r);
    int64_t at = 0;
    for (size_t p = 0; p < slot.pieces.size(); ++p) {
      const auto& [b, piece] = slot.pieces[p];
      const TensorView qv = MakeView(const_cast<char*>(in) + at, DType::kFloat8E4M3, {piece.numel}, device);
      const TensorView xv = MakeView(out + b, DType::kFloat32, {piece.numel}, device);
      if (absl::Status s = DequantizeTiledPiece(qv, piece, Tiles(scales_), xv); !s.ok()) return s;
      if (codes_.data() != nullptr) {
        char* to = static_cast<char*>(codes_.data()) + code_offsets_[slot.piece_matrix[p]] + piece.start;
        if (absl::Status s = CopyOnDevice(device, to, in + at, static_cast<size_t>(piece.numel)); !s.ok()) return s;
      }
      at += piece.numel;
    }
    const float* tail = reinterpret_cast<const float*>(in + slot.fp8_bytes);
    for (const auto& [b, e] : slot.rest) {
      if (absl::Status s = CopyFloats(out + b, tail, e - b); !s.ok()) return s;
      tail += e - b;
    }
  }
  return absl::OkStatus();
}

absl::Status Fp8AllGather::AllGather(const TensorView& shard, const TensorView& full) {
  if (absl::StatusOr<std::unique_ptr<comm::PendingCollective>> packed = CheckAndPack(shard, full, false);
      !packed.ok()) {
    return packed.status();
  }
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
  // `reduce`: the tiles' maxima all-reduce before the gather (kept, not
  // waited for, until this handle goes; may be null).
  StartedFp8Gather(std::unique_ptr<comm::PendingCollective> reduce, std::unique_ptr<comm::PendingCollective> gather,
                   std::function<absl::Status()> unpack)
      : reduce_(std::move(reduce)), gather_(std::move(gather)), unpack_(std::move(unpack)) {}
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
  std::unique_ptr<comm::PendingCollective> reduce_, gather_;
  std::function<absl::Status()> unpack_;
  bool unpacked_ = false;
  Device device_ = Device::kCpu;
};

}  // namespace

absl::StatusOr<std::unique_ptr<comm::PendingCollective>> Fp8AllGather::StartAllGather(const TensorView& shard,
                                                                                       const TensorView& full) {
  absl::StatusOr<std::unique_ptr<comm::PendingCollective>> reduce = CheckAndPack(shard, full, true);
  if (!reduce.ok()) return reduce.status();
  const int64_t words = slot_bytes_ / static_cast<int64_t>(sizeof(int32_t));
  absl::StatusOr<std::unique_ptr<comm::PendingCollective>> started = group_->StartAllGather(
      send_.View(DType::kInt32, {words}), received_.View(DType::kInt32, {words * group_->size()}));
  if (!started.ok()) return started.status();
  auto handle = std::make_unique<StartedFp8Gather>(*std::move(reduce), *std::move(started),
                                                   [this, full] { return UnpackAll(full); });
  handle->set_device(group_->device());
  return handle;
}

}  // namespace dist
}  // namespace recfleet
