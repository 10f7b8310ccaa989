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
// The FP8 elements are whole weight matrices (row-major [rows, cols]),
// quantized exactly as the FP8 GEMMs quantize a weight: E4M3 in 128x128
// tiles with the scale amax / 448 of the whole tile (kernels/quant/
// quantize.h TiledPiece), wherever the shards cut the matrix. Each rank
// takes the absolute maximum of every tile over its shard, the group
// all-reduces those (one fp32 per tile, 1/16,384 of a tile's elements;
// maximum), and every rank derives the same scales, so none travel with
// the gather. A rank's slot: its FP8 elements, one byte each in buffer
// order (16-byte aligned), then fp32 for every other element of its shard
// (padding included): 1 byte per FP8 element against 2 for bf16 and 4 for
// fp32. With keep_codes the whole matrices' codes and scales stay too, for
// FP8 GEMMs to take as their weight operands (kernels/gemm/linear.h
// LinearContext::SetWeight): exactly what they make of the fp32 weights.
// (Quantizing the dequantized copy again gives the same codes, but scales
// equal only to within fp32's rounding of amax / 448.) Slots have the size of the largest
// rank's (every rank computes every rank's layout), rounded up to 16
// bytes; the collective carries them as int32.
//
// Buffers live on the group's device: host memory for Gloo, the current
// CUDA device for NCCL. On CUDA every step (the tiles' maxima, quantizing,
// packing, unpacking, dequantizing) is queued on the legacy default
// stream, which orders it after the engine's work and before the
// collectives (whose stream waits for that one); the call returns once the
// last unpack is queued. Both devices give the same bits (the kernels are
// bit-identical). StartAllGather is the form FSDP prefetch uses: it starts
// the maxima's all-reduce, queues the packing behind it on the device (no
// host wait on CUDA; Gloo waits for the small all-reduce), starts the
// gather and unpacks when the handle is made ready or waited for.
// Not thread-safe (the communicator is not).

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/quant/quantize.h"
#include "kernels/tensor.h"
#include "worker/comm/communicator.h"
#include "worker/dist/device_buffer.h"
#include "worker/dist/fsdp.h"

namespace recfleet {
namespace dist {

// A weight matrix inside the flat buffer: row-major [rows, cols] from
// element `begin` of the unpadded buffer.
struct Fp8Matrix {
  int64_t begin = 0, rows = 0, cols = 0;
  int64_t end() const { return begin + rows * cols; }
};

class Fp8AllGather {
 public:
  // `matrices`: the weights to carry as FP8, sorted by `begin`, disjoint,
  // inside the layout's parameters. `group` is the FSDP group whose
  // `layout` this is (not owned; must outlive this object).
  // With `keep_codes`, every gather also keeps each matrix's whole FP8 form
  // (codes(), tile_scales()): 1 byte per FP8 element more, on the group's
  // device.
  static absl::StatusOr<Fp8AllGather> Create(const FlatShardLayout& layout, comm::Communicator* group,
                                             std::vector<Fp8Matrix> matrices, bool keep_codes = false);

  // full [padded_numel] fp32 = every group rank's `shard` [shard_numel]
  // fp32, in order, with the FP8 matrices rounded as described above (the
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
  // Bytes of the tiles' maxima every rank all-reduces first (fp32 each).
  int64_t amax_bytes() const { return tiles_ * static_cast<int64_t>(sizeof(float)); }
  // Elements of the flat buffer that travel as FP8.
  int64_t fp8_numel() const { return fp8_numel_; }

  // With keep_codes, after a gather is unpacked (AllGather returned, or its
  // started handle was made ready or waited for) and until the next one
  // starts: matrix i's codes [rows, cols] (E4M3, row-major) and its tiles'
  // scales [TileCount(rows, cols)] (row-major over the 128x128 tiles), what
  // Quantize(w, {k128x128, E4M3}) gives for the whole matrix w; `full`
  // holds their dequantized values. On CUDA they are written on the legacy
  // default stream. Empty views without keep_codes.
  TensorView codes(int i) const;
  TensorView tile_scales(int i) const;

 private:
  // Where one rank's shard elements go in its slot.
  struct SlotLayout {
    // Shard-relative offset of each piece of an FP8 matrix, in order.
    std::vector<std::pair<int64_t, TiledPiece>> pieces;
    std::vector<int> piece_matrix;  // Index into matrices_ of each piece.
    std::vector<std::pair<int64_t, int64_t>> rest;  // The other shard-relative ranges.
    int64_t fp8_numel = 0;
    int64_t fp8_bytes = 0;  // Of the FP8 part, 16-byte aligned.
    int64_t bytes = 0;      // Of the whole slot before rounding to the largest.
  };
  Fp8AllGather(const FlatShardLayout& layout, comm::Communicator* group) : layout_(layout), group_(group) {}
  static SlotLayout LayoutOf(const FlatShardLayout& layout, int rank, const std::vector<Fp8Matrix>& matrices,
                             const std::vector<int64_t>& first_tiles);
  // Checks both buffers, takes the tiles' maxima over this rank's shard,
  // all-reduces them (started when `started`; its handle is returned, to
  // be kept until the gather is done) and packs this rank's slot into
  // send_.
  absl::StatusOr<std::unique_ptr<comm::PendingCollective>> CheckAndPack(const TensorView& shard,
                                                                        const TensorView& full, bool started);
  // Every rank's slot from received_ into `full`.
  absl::Status UnpackAll(const TensorView& full);
  // `n` floats between two buffers on the group's device.
  absl::Status CopyFloats(float* dst, const float* src, int64_t n) const;
  TensorView Tiles(const DeviceBuffer& b) const { return b.View(DType::kFloat32, {tiles_}); }

  FlatShardLayout layout_;
  comm::Communicator* group_;
  std::vector<SlotLayout> slots_;  // Per group rank.
  std::vector<Fp8Matrix> matrices_;
  std::vector<int64_t> first_tiles_, code_offsets_;  // Per matrix; offsets into codes_.
  int64_t slot_bytes_ = 0, fp8_numel_ = 0, tiles_ = 0;
  // On the group's device.
  DeviceBuffer send_, received_;  // Packed slots (int32 words).
  DeviceBuffer amax_, scales_;    // Per tile of every matrix, fp32.
  DeviceBuffer codes_;            // keep_codes: every matrix's codes.
};

}  // namespace dist
}  // namespace recfleet

#endif  // RECFLEET_WORKER_DIST_FP8_ALL_GATHER_H_
