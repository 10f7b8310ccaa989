#ifndef RECFLEET_WORKER_DIST_FP8_ALL_GATHER_TESTING_H_
#define RECFLEET_WORKER_DIST_FP8_ALL_GATHER_TESTING_H_

// The FP8 all-gather's checks, shared by the Gloo test (threads) and the
// NCCL test (one rank per GPU): a group gathers a weight-like buffer,
// sharded FSDP-style, with some ranges in FP8 (or all of it at fp32 through
// FsdpFlatParameter); the bytes each rank hands to the collective are
// counted at the communicator.

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/comm/conformance.h"
#include "worker/comm/process_groups.h"
#include "worker/dist/fp8_all_gather.h"

namespace recfleet {
namespace dist {

// Forwards to a real communicator and counts the bytes each rank hands to
// AllGather and AllReduce: what the rank puts on the wire (an all-reduce
// moves up to twice its buffer; counted once).
class CountingCommunicator : public comm::Communicator {
 public:
  explicit CountingCommunicator(comm::Communicator* inner)
      : Communicator(inner->rank(), inner->size(), inner->device(), inner->timeout()), inner_(inner) {}
  absl::string_view backend() const override { return inner_->backend(); }
  int64_t all_gather_bytes = 0, all_reduce_bytes = 0;

 protected:
  absl::Status DoAllGather(const TensorView& in, const TensorView& out) override;
  absl::Status DoReduceScatter(const TensorView& in, const TensorView& out, comm::ReduceOp op) override;
  absl::Status DoAllReduce(const TensorView& inout, comm::ReduceOp op) override;
  absl::Status DoAllToAll(const TensorView& in, absl::Span<const int64_t> send_counts, const TensorView& out,
                          absl::Span<const int64_t> recv_counts) override;
  absl::Status DoBroadcast(const TensorView& inout, int root) override;
  absl::Status DoBarrier() override;

 private:
  comm::Communicator* inner_;
};

// A weight-like flat buffer: blocks of different magnitudes, some zeros.
std::vector<float> WeightLikeParameters(int64_t n, uint32_t seed);

// `params` with each matrix replaced by Dequantize(Quantize(w, 128x128
// E4M3)), as the FP8 GEMMs see it (the CPU reference kernels).
// With `codes` / `scales`, also each matrix's codes and tile scales.
std::vector<float> QuantizedLikeTheGemms(std::vector<float> params, const std::vector<Fp8Matrix>& matrices,
                                         std::vector<std::vector<uint8_t>>* codes = nullptr,
                                         std::vector<std::vector<float>>* scales = nullptr);

struct Gathered {
  std::vector<std::vector<float>> full;  // Per rank, downloaded.
  std::vector<int64_t> bytes;            // Per rank: bytes handed to AllGather.
  std::vector<int64_t> reduce_bytes;     // Per rank: bytes handed to AllReduce.
  int64_t slot_bytes = 0, fp8_numel = 0;
  // FP8 gathers (made with keep_codes), per rank and matrix: codes() and
  // tile_scales() after the first gather.
  std::vector<std::vector<std::vector<uint8_t>>> codes;
  std::vector<std::vector<std::vector<float>>> tile_scales;
  // Rank 0's median seconds per AllGather over `timed` calls after one
  // warm-up (0 when timed is 0), the device synchronized around each.
  double seconds = 0;
};

// `group` ranks (rank r connects through factory_for_rank(r); its buffers
// come from `memory`) gather `params` with `fp8_matrices` in FP8, or at fp32
// with FsdpFlatParameter when `fp8` is false; with `started`, through
// StartAllGather and the handle's Ready() (then the device synchronized).
Gathered GatherOnRanks(int group, const std::vector<float>& params,
                       const std::vector<Fp8Matrix>& fp8_matrices, bool fp8,
                       comm::TestMemory& memory, const std::function<comm::CommFactory(int rank)>& factory_for_rank,
                       int timed = 0, bool started = false);

}  // namespace dist
}  // namespace recfleet

#endif  // RECFLEET_WORKER_DIST_FP8_ALL_GATHER_TESTING_H_
