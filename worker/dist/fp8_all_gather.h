#ifndef RECFLEET_WORKER_DIST_FP8_ALL_GATHER_H_
#define RECFLEET_WORKER_DIST_FP8_ALL_GATHER_H_

// The FSDP all-gather with part of the flat buffer carried as FP8 ("quantize
// before all-gather", the precision recipe's model.precision.all_gather):
// each rank quantizes the elements of its fp32 shard that fall in the FP8
// ranges (the weights of the layers the recipe runs in FP8) once, packs
// them with their scales next to the rest of its shard (still fp32), and
// the group all-gathers the packed buffers; every rank then unpacks every
// slot, its own included, so all ranks compute on the same dequantized
// weights. The master weights in the shard stay fp32; only the gathered
// copy is rounded.
//
// Wire format of one rank's slot (kernels/quant/quantize.h PackedBytes):
// the shard's FP8 elements, concatenated in buffer order and viewed as a
// [n / 32, 32] matrix, quantized to E4M3 in 32x32 blocks (1,024 consecutive
// elements) with one power-of-two E8M0 scale byte each, so a block never
// saturates; then fp32 for the last n % 32 FP8 elements and for every
// other element of the shard (padding included). That is 1 + 1/1024 bytes
// per FP8 element against 2 for bf16 and 4 for fp32. A block may span two
// neighbouring weights and then shares one scale between them. Slots have
// the size of the largest rank's (every rank computes every rank's layout),
// rounded up to 16 bytes; the collective carries them as int32.
//
// Buffers live on the group's device: host memory for Gloo, the current
// CUDA device for NCCL. On CUDA every step (gathering the FP8 elements,
// quantizing, packing, unpacking, dequantizing, scattering them back) is
// queued on the legacy default stream, which orders it after the engine's
// work and before the collective (whose stream waits for that one); the
// call returns once the last unpack is queued. Both devices give the same
// bits (the quantization kernels are bit-identical). StartAllGather is the
// form FSDP prefetch uses: it packs, starts the collective and unpacks when
// the handle is made ready or waited for.
// Not thread-safe (the communicator is not).

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"
#include "worker/comm/communicator.h"
#include "worker/dist/device_buffer.h"
#include "worker/dist/fsdp.h"

namespace recfleet {
namespace dist {

class Fp8AllGather {
 public:
  // `fp8_ranges`: [begin, end) element ranges of the unpadded flat buffer
  // to carry as FP8, sorted and disjoint. `group` is the FSDP group whose
  // `layout` this is (not owned; must outlive this object).
  static absl::StatusOr<Fp8AllGather> Create(const FlatShardLayout& layout, comm::Communicator* group,
                                             std::vector<std::pair<int64_t, int64_t>> fp8_ranges);

  // full [padded_numel] fp32 = every group rank's `shard` [shard_numel]
  // fp32, in order, with the FP8 ranges rounded as described above (the
  // rest exact). Same contract as FsdpFlatParameter::AllGather, both
  // buffers on the group's device.
  absl::Status AllGather(const TensorView& shard, const TensorView& full);
  // The same as a started collective (Communicator::StartAllGather): the
  // shard is packed now (queued, on CUDA), the gather runs behind the
  // communicator's earlier collectives, and the handle's Ready() or Wait()
  // unpacks into `full` (Ready on CUDA queues the unpack on the legacy
  // default stream behind the gather without a host wait; Gloo waits).
  // `full` must not be read before then. One started gather per object at
  // a time (its buffers hold it); this object must outlive the handle.
  absl::StatusOr<std::unique_ptr<comm::PendingCollective>> StartAllGather(const TensorView& shard,
                                                                          const TensorView& full);

  // Bytes every rank contributes to one AllGather (its slot); the group
  // moves size() times that. An fp32 gather contributes shard_numel x 4.
  int64_t slot_bytes() const { return slot_bytes_; }
  // Elements of the flat buffer that travel as FP8.
  int64_t fp8_numel() const { return fp8_numel_; }

 private:
  // Where one rank's shard elements go in its slot.
  struct SlotLayout {
    std::vector<std::pair<int64_t, int64_t>> fp8;   // Shard-relative ranges, in order.
    std::vector<std::pair<int64_t, int64_t>> rest;  // The other shard-relative ranges.
    int64_t fp8_numel = 0;
    int64_t quantized_rows = 0;  // Of 32 FP8 elements; the rest of them go as fp32.
    int64_t packed_bytes = 0;    // Of the quantized matrix, 16-byte aligned.
    int64_t bytes = 0;           // Of the whole slot before rounding to the largest.
  };
  Fp8AllGather(const FlatShardLayout& layout, comm::Communicator* group) : layout_(layout), group_(group) {}
  static SlotLayout LayoutOf(const FlatShardLayout& layout, int rank,
                             const std::vector<std::pair<int64_t, int64_t>>& fp8_ranges);
  absl::Status Pack(const SlotLayout& slot, const float* shard, char* out);
  absl::Status Unpack(const SlotLayout& slot, const char* in, float* shard_out);
  // Checks both buffers and packs this rank's slot into send_.
  absl::Status CheckAndPack(const TensorView& shard, const TensorView& full);
  // Every rank's slot from received_ into `full`.
  absl::Status UnpackAll(const TensorView& full);
  // `n` floats between two buffers on the group's device.
  absl::Status CopyFloats(float* dst, const float* src, int64_t n) const;

  FlatShardLayout layout_;
  comm::Communicator* group_;
  std::vector<SlotLayout> slots_;  // Per group rank.
  int64_t slot_bytes_ = 0, fp8_numel_ = 0;
  // On the group's device, sized for the largest slot.
  DeviceBuffer staging_;          // One slot's FP8 elements, fp32.
  DeviceBuffer send_, received_;  // Packed slots (int32 words).
  DeviceBuffer q_;                // One slot's unpacked FP8 payload.
  DeviceBuffer scales_;           // ... and its scales (fp32).
};

}  // namespace dist
}  // namespace recfleet

#endif  // RECFLEET_WORKER_DIST_FP8_ALL_GATHER_H_
